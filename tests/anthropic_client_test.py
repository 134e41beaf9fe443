"""kvserve serve's Messages API against a real client: the PyPI `anthropic` package.

Run by scripts/openai_client_test.sh (KVSERVE_TEST_PACKAGES="anthropic"), which
starts the server on the real default model and sets KVSERVE_URL (".../v1")
and KVSERVE_API_KEY.
"""
import json
import os
import urllib.request

import anthropic

URL = os.environ["KVSERVE_URL"]
ROOT = URL.rsplit("/v1", 1)[0]
KEY = os.environ["KVSERVE_API_KEY"]
SYSTEM = "You are a helpful assistant."
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# The SDK (2.x) no longer types temperature; the API and this server still take it.
GREEDY = {"temperature": 0}
WEATHER = {
    "name": "get_weather",
    "description": "Get the weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def openai_chat(body):
    """The same request through /v1/chat/completions (the path Messages is translated onto)."""
    req = urllib.request.Request(URL + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def check_plain_and_streamed(client):
    whole = client.messages.create(model="tiny", max_tokens=24, system=SYSTEM, messages=QUESTION, extra_body=GREEDY)
    assert whole.type == "message" and whole.role == "assistant", whole
    assert whole.id.startswith("msg_"), whole.id
    assert [b.type for b in whole.content] == ["text"], whole.content
    assert whole.stop_reason in ("end_turn", "max_tokens"), whole.stop_reason
    assert whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0, whole.usage
    text = whole.content[0].text
    # One translation onto the chat path: the same greedy text as the OpenAI endpoint gives.
    chat = openai_chat({"messages": [{"role": "system", "content": SYSTEM}] + QUESTION, "max_tokens": 24,
                        "temperature": 0})
    assert chat["choices"][0]["message"]["content"] == text, (chat, text)

    with client.messages.stream(model="tiny", max_tokens=24, system=SYSTEM, messages=QUESTION,
                                extra_body=GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text, (streamed, text)
    assert final.content[0].text == text and final.stop_reason == whole.stop_reason, final
    assert final.usage.output_tokens == whole.usage.output_tokens, (final.usage, whole.usage)

    counted = client.messages.count_tokens(model="tiny", system=SYSTEM, messages=QUESTION)
    assert counted.input_tokens == whole.usage.input_tokens + whole.usage.cache_read_input_tokens, (counted, whole.usage)
    return text


def check_stop_sequence(client, text):
    words = text.split()
    if len(words) < 3:
        return
    stop = " " + words[2]
    out = client.messages.create(model="tiny", max_tokens=24, system=SYSTEM, messages=QUESTION, extra_body=GREEDY,
                                 stop_sequences=[stop])
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == stop, out
    assert stop not in out.content[0].text, out


def check_tool_round_trip(client):
    forced = {"type": "tool", "name": "get_weather"}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    out = client.messages.create(model="tiny", max_tokens=64, messages=ask, tools=[WEATHER], tool_choice=forced,
                                 extra_body=GREEDY)
    uses = [b for b in out.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather", out.content
    assert isinstance(uses[0].input.get("city"), str), uses[0].input
    assert uses[0].id.startswith("toolu_"), uses[0].id
    assert out.stop_reason == "tool_use", out.stop_reason

    # Streamed: the call arrives as a tool_use block with its input as input_json_delta.
    with client.messages.stream(model="tiny", max_tokens=64, messages=ask, tools=[WEATHER], tool_choice=forced,
                                extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    streamed_uses = [b for b in final.content if b.type == "tool_use"]
    assert len(streamed_uses) == 1 and streamed_uses[0].input == uses[0].input, (final.content, uses)
    assert final.stop_reason == "tool_use", final.stop_reason

    # The result goes back as a tool_result block; the model answers in text.
    history = ask + [{"role": "assistant", "content": out.content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                   "content": "18 degrees and sunny"}]}]
    answer = client.messages.create(model="tiny", max_tokens=24, messages=history, tools=[WEATHER], extra_body=GREEDY,
                                    tool_choice={"type": "none"})
    assert answer.content and answer.content[0].type == "text" and answer.content[0].text, answer
    assert answer.stop_reason in ("end_turn", "max_tokens"), answer.stop_reason


def check_errors(client):
    try:
        client.messages.create(model="tiny", max_tokens=0, messages=QUESTION)
        raise AssertionError("max_tokens 0 was accepted")
    except anthropic.BadRequestError as e:
        assert e.body["error"]["type"] == "invalid_request_error", e.body
        assert "max_tokens" in e.body["error"]["message"], e.body
    try:
        client.messages.create(model="tiny", max_tokens=8,
                               messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])
        raise AssertionError("an image block was accepted")
    except anthropic.BadRequestError as e:
        assert "image" in e.body["error"]["message"], e.body
    wrong = anthropic.Anthropic(base_url=ROOT, api_key="wrong-key", max_retries=0)
    try:
        wrong.messages.create(model="tiny", max_tokens=8, messages=QUESTION)
        raise AssertionError("a wrong key was accepted")
    except anthropic.AuthenticationError as e:
        assert e.body["error"]["type"] == "authentication_error", e.body


def main():
    client = anthropic.Anthropic(base_url=ROOT, api_key=KEY, max_retries=0)
    text = check_plain_and_streamed(client)
    check_stop_sequence(client, text)
    check_tool_round_trip(client)
    check_errors(client)
    print("anthropic client: plain, streamed, count_tokens, stop_sequences, tool_use round trip, errors: ok")


if __name__ == "__main__":
    main()
