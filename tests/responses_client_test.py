"""kvserve serve's Responses API against real clients: the PyPI `openai` package's
responses.create / responses.stream, and an agent loop from `openai-agents`
(skipped with a message when that package is missing).

Run by scripts/openai_client_test.sh, which starts the server on the real default
model and sets KVSERVE_URL (".../v1") and KVSERVE_API_KEY.
"""
import json
import os
import urllib.request

import jsonschema
import openai
from openai import OpenAI

URL = os.environ["KVSERVE_URL"]
KEY = os.environ["KVSERVE_API_KEY"]
SYSTEM = "You are a helpful assistant."
QUESTION = "What is the capital of France?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def chat_text(messages, max_tokens):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request(URL + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)["choices"][0]["message"]["content"]


def check_plain_and_streamed(client):
    whole = client.responses.create(model="tiny", instructions=SYSTEM, input=QUESTION, max_output_tokens=24,
                                    temperature=0)
    assert whole.object == "response" and whole.id.startswith("resp_"), whole
    assert whole.status in ("completed", "incomplete"), whole.status
    assert whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0, whole.usage
    text = whole.output_text
    # One translation onto the chat path: the same greedy text as /v1/chat/completions.
    expected = chat_text([{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}], 24)
    assert text == expected, (text, expected)

    events = list(client.responses.create(model="tiny", instructions=SYSTEM, input=QUESTION, max_output_tokens=24,
                                          temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[1] == "response.in_progress", kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert [e.sequence_number for e in events] == list(range(len(events))), [(e.type, e.sequence_number) for e in events]
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == text, (streamed, text)
    done = [e for e in events if e.type == "response.output_text.done"]
    assert len(done) == 1 and done[0].text == text, done
    assert events[-1].response.output_text == text
    return text


def check_function_call_round_trip(client):
    forced = {"type": "function", "name": "get_weather"}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    out = client.responses.create(model="tiny", input=ask, tools=[WEATHER], tool_choice=forced, temperature=0,
                                  max_output_tokens=64)
    calls = [item for item in out.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", out.output
    assert isinstance(json.loads(calls[0].arguments).get("city"), str), calls[0].arguments

    # Streamed through the SDK's helper: the call's arguments arrive as deltas of one item.
    with client.responses.stream(model="tiny", input=ask, tools=[WEATHER], tool_choice=forced, temperature=0,
                                 max_output_tokens=64) as stream:
        final = stream.get_final_response()
    streamed_calls = [item for item in final.output if item.type == "function_call"]
    assert len(streamed_calls) == 1 and streamed_calls[0].arguments == calls[0].arguments, (final.output, calls)

    # The result goes back as a function_call_output item; the model answers in text.
    history = ask + [item.model_dump(exclude_none=True) for item in out.output] + [
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 degrees and sunny"}]
    answer = client.responses.create(model="tiny", input=history, tools=[WEATHER], tool_choice="none",
                                     temperature=0, max_output_tokens=24)
    assert answer.output_text, answer.output


def check_json_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    out = client.responses.create(model="tiny", input="Name a city and its country as JSON.", temperature=0,
                                  max_output_tokens=96,
                                  text={"format": {"type": "json_schema", "name": "place", "schema": schema,
                                                   "strict": True}})
    assert out.status == "completed", out
    jsonschema.validate(json.loads(out.output_text), schema)


def check_store(client):
    first = client.responses.create(model="tiny", input="My name is Ann.", temperature=0, max_output_tokens=8)
    second = client.responses.create(model="tiny", previous_response_id=first.id, input="What is my name?",
                                     temperature=0, max_output_tokens=8)
    # The history (the first input and answer) is in the second prompt.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens, (first.usage, second.usage)
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    try:
        client.responses.create(model="tiny", previous_response_id=first.id, input="Again?", max_output_tokens=4)
        raise AssertionError("a deleted response was continued")
    except openai.BadRequestError as e:
        assert e.body["param"] == "previous_response_id", e.body
    unstored = client.responses.create(model="tiny", input="Hi", store=False, max_output_tokens=4)
    try:
        client.responses.retrieve(unstored.id)
        raise AssertionError("a store: false response was kept")
    except openai.NotFoundError:
        pass


def check_agent_loop():
    try:
        import agents
    except ImportError:
        print("skipped the agent loop: needs the openai-agents package (pip install openai-agents)")
        return
    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=URL, api_key=KEY)
    model = agents.OpenAIResponsesModel(model="tiny", openai_client=client)
    calls = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the weather in a city."""
        calls.append(city)
        return f"The weather in {city} is sunny."

    # One call per turn (parallel_tool_calls false, sent by the SDK and enforced by the server's tool grammar): with
    # several allowed, the 135M model's greedy answer calls the tool twice for Paris in one turn.
    agent = agents.Agent(name="weather", instructions="Answer with the weather tool.", model=model,
                         tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                         model_settings=agents.ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                                             temperature=0, max_tokens=64))
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=3)
    assert len(calls) == 1, calls
    assert result.final_output == f"The weather in {calls[0]} is sunny.", result.final_output
    print("openai-agents: the agent called its tool and finished:", result.final_output)


def main():
    client = OpenAI(base_url=URL, api_key=KEY, max_retries=0)
    check_plain_and_streamed(client)
    check_function_call_round_trip(client)
    check_json_schema(client)
    check_store(client)
    check_agent_loop()
    print("responses client: plain, streamed, function call round trip, json_schema, store: ok")


if __name__ == "__main__":
    main()
