"""kvserve serve's Ollama API against a real client: the PyPI `ollama` package.

Run by scripts/openai_client_test.sh (KVSERVE_TEST_PACKAGES="ollama jsonschema"),
which starts the server on the real default model and sets KVSERVE_URL
(".../v1") and KVSERVE_API_KEY.
"""
import json
import os
import sys

try:
    import jsonschema
    import ollama
except ImportError as missing:  # the script's own check, for runs without the wrapper
    print(f"skipped: needs the {missing.name} package (pip install ollama jsonschema)")
    sys.exit(77)

URL = os.environ["KVSERVE_URL"]
ROOT = URL.rsplit("/v1", 1)[0]
KEY = os.environ["KVSERVE_API_KEY"]
MODEL = "smollm2-135m-instruct-q4_1:latest"
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in two sentences."}]
GREEDY = {"temperature": 0, "seed": 42, "num_predict": 32}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def check_models(client):
    listed = client.list()
    assert [m.model for m in listed.models] == [MODEL], listed
    model = listed.models[0]
    assert model.size > 0 and len(model.digest) == 64, model
    assert model.details.format == "gguf" and model.details.family == "llama", model.details
    assert model.details.quantization_level == "Q4_1" and model.details.parameter_size.endswith("M"), model.details
    shown = client.show(MODEL)
    assert shown.modelinfo["general.architecture"] == "llama", shown.modelinfo
    assert shown.modelinfo["llama.context_length"] > 0, shown.modelinfo
    assert "completion" in shown.capabilities, shown.capabilities
    assert shown.template, "show gives the chat template"
    assert client.show("smollm2-135m-instruct-q4_1").details.family == "llama"  # without the tag
    running = client.ps()
    assert [m.model for m in running.models] == [MODEL], running
    assert running.models[0].expires_at is not None and running.models[0].size > 0, running


def check_chat(client):
    whole = client.chat(model=MODEL, messages=QUESTION, options=GREEDY, stream=False)
    assert whole.done and whole.done_reason in ("stop", "length"), whole
    assert whole.message.role == "assistant" and whole.message.content, whole.message
    assert whole.eval_count > 0 and whole.prompt_eval_count > 0, whole
    assert whole.total_duration >= whole.eval_duration > 0, whole

    chunks = list(client.chat(model=MODEL, messages=QUESTION, options=GREEDY, stream=True))
    texts = [c.message.content for c in chunks if c.message.content]
    assert len(texts) >= 2, f"the text came in {len(texts)} chunk(s)"
    assert all(not c.done for c in chunks[:-1]), chunks
    final = chunks[-1]
    assert final.done and final.eval_count == whole.eval_count, final
    assert final.done_reason == whole.done_reason, final
    assert "".join(texts) == whole.message.content, (texts, whole.message.content)
    return whole


def check_generate(client):
    whole = client.generate(model=MODEL, prompt="Write one sentence about the sea.", options=GREEDY, stream=False)
    assert whole.done and whole.response, whole
    pieces = list(client.generate(model=MODEL, prompt="Write one sentence about the sea.", options=GREEDY, stream=True))
    assert len([p for p in pieces if p.response]) >= 2 and pieces[-1].done, pieces
    assert "".join(p.response for p in pieces) == whole.response, (pieces, whole.response)
    assert pieces[-1].eval_count == whole.eval_count, pieces[-1]
    raw = client.generate(model=MODEL, prompt="Once upon a time", raw=True, options=GREEDY)
    assert raw.done and raw.response, raw
    system = client.generate(model=MODEL, prompt="Hi!", system="Answer like a pirate.", options=GREEDY)
    assert system.done and system.response, system
    loaded = client.generate(model=MODEL)  # no prompt: Ollama's way to load a model
    assert loaded.done and loaded.done_reason == "load", loaded


def check_structured_output(client):
    ask = [{"role": "user", "content": "Invent a person. Reply in JSON with their name and age."}]
    out = client.chat(model=MODEL, messages=ask, format=PERSON, options={"temperature": 0, "num_predict": 64})
    person = json.loads(out.message.content)
    jsonschema.validate(person, PERSON)
    json_mode = client.chat(model=MODEL, messages=ask, format="json", options={"temperature": 0, "num_predict": 64})
    assert isinstance(json.loads(json_mode.message.content), dict), json_mode.message.content
    generated = client.generate(model=MODEL, prompt="Invent a person as JSON.", format=PERSON,
                                options={"temperature": 0, "num_predict": 64})
    jsonschema.validate(json.loads(generated.response), PERSON)


def check_options(client):
    sampled = {"temperature": 0, "seed": 7, "num_predict": 24}
    first = client.chat(model=MODEL, messages=QUESTION, options=sampled)
    second = client.chat(model=MODEL, messages=QUESTION, options=sampled)
    assert first.message.content == second.message.content, (first.message.content, second.message.content)
    seeded = {"temperature": 0.9, "seed": 11, "num_predict": 24}
    a = client.chat(model=MODEL, messages=QUESTION, options=seeded)
    b = client.chat(model=MODEL, messages=QUESTION, options=seeded)
    assert a.message.content == b.message.content, (a.message.content, b.message.content)
    short = client.chat(model=MODEL, messages=QUESTION, options={"temperature": 0, "num_predict": 3})
    assert short.eval_count <= 3 and short.done_reason in ("length", "stop"), short
    assert client.chat(model=MODEL, messages=QUESTION, options={"temperature": 0, "num_predict": 3, "stop": ["Paris"]}).done


def check_tools(client):
    ask = [{"role": "user", "content": "What is the weather in Paris? Use the get_weather tool."}]
    out = client.chat(model=MODEL, messages=ask, tools=[WEATHER], options={"temperature": 0, "num_predict": 64})
    calls = out.message.tool_calls or []
    for call in calls:  # a 135M model may answer in text instead; a call it makes has Ollama's shape
        assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict), call
    # The call and its result go back, the result as a tool message; the model answers.
    call = calls[0] if calls else {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    history = ask + [{"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "tool_name": "get_weather", "content": "18 degrees and sunny"}]
    answer = client.chat(model=MODEL, messages=history, options={"temperature": 0, "num_predict": 24})
    assert answer.done and answer.message.role == "assistant", answer


def check_errors(client):
    try:
        client.chat(model="llama3:8b", messages=QUESTION)
        raise AssertionError("an unknown model was accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 404, e
        assert "llama3:8b" in e.error and MODEL in e.error, e.error
    try:
        client.chat(model=MODEL, messages=QUESTION, options={"temperature": "hot"})
        raise AssertionError("a string temperature was accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 400 and "options.temperature" in e.error, e
    try:
        client.embed(model=MODEL, input="hi")
        raise AssertionError("embeddings answered")
    except ollama.ResponseError as e:
        assert e.status_code == 404 and "not implemented" in e.error, e
    wrong = ollama.Client(host=ROOT, headers={"Authorization": "Bearer wrong-key"})
    try:
        wrong.list()
        raise AssertionError("a wrong key was accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 401, e


def main():
    client = ollama.Client(host=ROOT, headers={"Authorization": "Bearer " + KEY}, timeout=120)
    check_models(client)
    whole = check_chat(client)
    check_generate(client)
    check_structured_output(client)
    check_options(client)
    check_tools(client)
    check_errors(client)
    print(f"ollama client {ollama.__version__ if hasattr(ollama, '__version__') else ''}: list, show, ps, "
          f"chat (whole, {whole.eval_count} tokens; streamed), generate (whole, streamed, raw, system, load), "
          "format (schema, json), options (seed, temperature, num_predict, stop), tools, errors: ok")


if __name__ == "__main__":
    main()
