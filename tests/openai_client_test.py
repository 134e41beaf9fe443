"""kvserve serve against a real client: the PyPI `openai` package.

Run by scripts/openai_client_test.sh, which starts the server and sets
KVSERVE_URL (".../v1") and KVSERVE_API_KEY.
"""
import os
import sys
import time
import urllib.request

import openai
from openai import OpenAI

URL = os.environ["KVSERVE_URL"]
KEY = os.environ["KVSERVE_API_KEY"]
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def wait_until_healthy(timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    health = URL.rsplit("/v1", 1)[0] + "/health"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(health, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    sys.exit("the server did not become healthy")


def check_chat(client, model):
    whole = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, temperature=0)
    answer = whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason in ("stop", "length"), whole.choices[0].finish_reason
    assert whole.usage.prompt_tokens > 0 and whole.usage.completion_tokens > 0
    assert "Paris" in answer, answer

    text, finish, usage, chunks = "", None, None, 0
    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True})
    for chunk in stream:
        chunks += 1
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert chunks > 2, chunks
    assert text == answer, (text, answer)
    assert finish == whole.choices[0].finish_reason, finish
    assert usage.completion_tokens == whole.usage.completion_tokens, usage
    print(f"chat ok: {answer!r} ({chunks} chunks)")


def check_completions_and_errors(client, model):
    c = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=2)
    assert c.choices[0].text and len(c.choices[0].logprobs.tokens) == 8
    # Prompt scoring as lm-eval's loglikelihood asks for it: echo, logprobs, no new token.
    scored = client.completions.create(model=model, prompt="Once upon a time", max_tokens=0, temperature=0,
                                       echo=True, logprobs=1)
    lp = scored.choices[0].logprobs
    assert scored.choices[0].text.startswith("Once upon a time"), scored.choices[0].text
    assert len(lp.tokens) >= 4 and lp.token_logprobs[0] is None, lp
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:]), lp.token_logprobs
    assert "".join(lp.tokens).endswith("Once upon a time"), lp.tokens
    try:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, temperature=7)
        raise AssertionError("temperature 7 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == "temperature", e.body
    bad = OpenAI(base_url=URL, api_key="wrong-key", max_retries=0)
    try:
        bad.models.list()
        raise AssertionError("a wrong API key was accepted")
    except openai.AuthenticationError:
        pass
    print("completions and errors ok")


def main():
    wait_until_healthy()
    client = OpenAI(base_url=URL, api_key=KEY, max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    check_chat(client, model)
    check_completions_and_errors(client, model)


if __name__ == "__main__":
    main()
