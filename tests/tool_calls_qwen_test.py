"""Tool calling with tool_choice "auto" on a real tool-trained model (Qwen2.5-Coder-0.5B-Instruct).

Run by scripts/openai_client_test.sh (ctest: tool_calls_qwen; skipped without the optional model, which
`scripts/fetch_models.sh --qwen-coder` fetches): the model decides by itself to call get_weather, and the
conversation with the tool's result goes back to it.
"""
import json
import os

from openai import OpenAI

client = OpenAI(base_url=os.environ["KVSERVE_URL"], api_key=os.environ["KVSERVE_API_KEY"], max_retries=0, timeout=300)
MODEL = client.models.list().data[0].id
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}


def main():
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], tool_choice="auto",
                                           max_tokens=80, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather", call
    assert "paris" in json.loads(call.function.arguments)["city"].lower(), call
    result = {"city": "Paris", "temperature": 18, "unit": "celsius", "sky": "clear"}
    follow = client.chat.completions.create(model=MODEL, tools=[WEATHER], tool_choice="auto", max_tokens=60, temperature=0,
                                            messages=messages + [
                                                {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                                                {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}])
    answer = follow.choices[0]
    # The conversation with the call and its result renders and runs. This code model does not go on to answer
    # in text: it calls get_weather again (llama-server --jinja does the same with this file;
    # docs/structured_output.md), so only that it answers at all is checked.
    assert answer.message.content or answer.message.tool_calls, answer
    print(f"auto: {call.function.name}({call.function.arguments}); after the result: {answer.message.content!r} "
          f"({len(answer.message.tool_calls or [])} more calls, finish_reason {answer.finish_reason})")
    check_streamed_arguments(messages, call)


def check_streamed_arguments(messages, whole_call):
    """Streamed, the call is named first and its arguments come in pieces as the model writes them."""
    pieces, name, finish = [], None, None
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], tool_choice="auto",
                                                max_tokens=80, temperature=0, stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                assert delta.index == 0, delta
                if delta.function.name:
                    assert name is None and not pieces, delta  # the name comes once, first
                    name = delta.function.name
                    assert delta.id == delta.id.strip() and delta.id.startswith("call_"), delta
                if delta.function.arguments:
                    pieces.append(delta.function.arguments)
    assert name == "get_weather" and finish == "tool_calls", (name, finish)
    assert "".join(pieces) == whole_call.function.arguments, (pieces, whole_call.function.arguments)
    assert len(pieces) > 2, pieces  # incremental, not one piece at the end
    print(f"streamed: {name} named first, arguments in {len(pieces)} pieces: {pieces}")


if __name__ == "__main__":
    main()
