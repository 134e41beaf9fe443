"""A many-model kvserve (two models, one loaded at a time) against the PyPI `ollama` client.

Run by scripts/openai_client_test.sh with --models-preset tests/data/router_presets.ini --models-max 1: lists both
models, chats with each (the other is unloaded to make room), unloads with keep_alive=0 (after a generation, and
with nothing to generate), lets a short keep_alive expire, and reads the per-model /metrics.
"""
import os
import sys
import time
import urllib.request

try:
    import ollama
except ImportError as missing:
    print(f"skipped: needs the {missing.name} package (pip install ollama)")
    sys.exit(77)

URL = os.environ["KVSERVE_URL"]
ROOT = URL.rsplit("/v1", 1)[0]
KEY = os.environ["KVSERVE_API_KEY"]
SMOLLM = "smollm2-135m-instruct-q4_1:latest"
STORIES = "stories:latest"
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
GREEDY = {"temperature": 0, "seed": 42, "num_predict": 16}


def running(client):
    return [m.model for m in client.ps().models]


def wait_until_unloaded(client, seconds=20):
    deadline = time.time() + seconds
    while running(client) and time.time() < deadline:
        time.sleep(0.1)
    return running(client)


def metrics():
    request = urllib.request.Request(ROOT + "/metrics", headers={"Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.read().decode()


def main():
    client = ollama.Client(host=ROOT, headers={"Authorization": "Bearer " + KEY}, timeout=120)
    assert sorted(m.model for m in client.list().models) == [SMOLLM, STORIES], client.list()
    assert running(client) == [], running(client)

    first = client.chat(model=SMOLLM, messages=QUESTION, options=GREEDY)
    assert first.done and first.message.content, first
    assert first.total_duration > first.load_duration > 0, first  # this request loaded its model
    assert running(client) == [SMOLLM], running(client)
    assert client.ps().models[0].context_length == 1024, client.ps()  # [*] ctx-size

    story = client.generate(model=STORIES, prompt="Once upon a time", options=GREEDY)
    assert story.done and story.response, story
    assert running(client) == [STORIES], running(client)  # --models-max 1: smollm2 made room
    streamed = list(client.chat(model=STORIES, messages=[{"role": "user", "content": "Tell a story."}],
                                options=GREEDY, stream=True))
    assert streamed[-1].done, streamed

    again = client.chat(model=SMOLLM, messages=QUESTION, options=GREEDY, keep_alive=0)
    assert again.message.content == first.message.content, (again.message.content, first.message.content)
    assert running(client) == [], running(client)  # keep_alive=0: unloaded once the request ended

    assert client.generate(model=STORIES).done_reason == "load"
    assert running(client) == [STORIES], running(client)
    assert client.generate(model=STORIES, keep_alive=0).done_reason == "unload"
    assert running(client) == [], running(client)

    client.chat(model=SMOLLM, messages=QUESTION, options=GREEDY, keep_alive="300ms")
    assert wait_until_unloaded(client) == [], running(client)

    client.chat(model=SMOLLM, messages=QUESTION, options=GREEDY, keep_alive=-1)
    text = metrics()
    assert 'kvserve_generation_tokens_total{model="smollm2-135m-instruct-q4_1"}' in text, text
    assert "kvserve:model_loads_total 6" in text, text
    assert "kvserve:models_memory_budget_bytes 1073741824" in text, text
    try:
        client.chat(model="llama3:8b", messages=QUESTION)
        raise AssertionError("an unknown model was accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 404 and "stories" in e.error and "smollm2" in e.error, e.error
    print("ollama client, two models: list, ps, chat and generate with each (one loaded at a time), "
          "keep_alive 0 / duration / -1, per-model metrics, 404: ok")


if __name__ == "__main__":
    main()
