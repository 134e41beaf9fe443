#!/usr/bin/env python3
"""Throughput of one chat request through each API shape of a running kvserve:
/v1/chat/completions, Anthropic's /v1/messages and OpenAI's /v1/responses, the
same greedy request (the same tokens) interleaved round by round, streamed and not.

Usage: tools/bench_api_shapes.py URL [--rounds 5] [--requests 4] [--max-tokens 128] [--concurrency 1]
  URL: the server's root, e.g. http://127.0.0.1:8080 (an API key from KVSERVE_API_KEY)
"""
import argparse
import concurrent.futures
import json
import os
import statistics
import time
import urllib.request

SYSTEM = "You are a helpful assistant."
QUESTION = "Write a short story about a robot who learns to paint."


def body_of(shape, max_tokens, stream):
    if shape == "chat":
        return "/v1/chat/completions", {"messages": [{"role": "system", "content": SYSTEM},
                                                     {"role": "user", "content": QUESTION}],
                                        "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if shape == "messages":
        return "/v1/messages", {"system": SYSTEM, "messages": [{"role": "user", "content": QUESTION}],
                                "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    return "/v1/responses", {"instructions": SYSTEM, "input": QUESTION, "max_output_tokens": max_tokens,
                             "temperature": 0, "stream": stream, "store": False}


def tokens_of(shape, data, stream):
    """Completion tokens the answer reports."""
    if stream:
        for line in reversed(data.decode().splitlines()):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if shape == "messages" and event.get("type") == "message_delta":
                return event["usage"]["output_tokens"]
            if shape == "responses" and event.get("type", "").startswith("response.") and "response" in event:
                return event["response"]["usage"]["output_tokens"]
            if shape == "chat" and "choices" in event:
                return None  # counted from the whole answer instead
        return None
    answer = json.loads(data)
    if shape == "chat":
        return answer["usage"]["completion_tokens"]
    return answer["usage"]["output_tokens"]


def one(url, shape, max_tokens, stream):
    path, body = body_of(shape, max_tokens, stream)
    headers = {"Content-Type": "application/json"}
    if os.environ.get("KVSERVE_API_KEY"):
        headers["Authorization"] = "Bearer " + os.environ["KVSERVE_API_KEY"]
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=600) as r:
        return r.read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=1)
    args = ap.parse_args()
    shapes = ["chat", "messages", "responses"]
    tokens = tokens_of("chat", one(args.url, "chat", args.max_tokens, False), False)  # warm-up; same for all
    for shape in shapes[1:]:
        got = tokens_of(shape, one(args.url, shape, args.max_tokens, False), False)
        assert got == tokens, f"{shape} generated {got} tokens, chat {tokens}: not the same request"
    for stream in (False, True):
        rates = {s: [] for s in shapes}
        for _ in range(args.rounds):
            for shape in shapes:  # interleaved: host noise falls on every shape alike
                start = time.perf_counter()
                with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                    list(pool.map(lambda _: one(args.url, shape, args.max_tokens, stream),
                                  range(args.requests * args.concurrency)))
                elapsed = time.perf_counter() - start
                rates[shape].append(tokens * args.requests * args.concurrency / elapsed)
        base = statistics.median(rates["chat"])
        print(f"\n{'streamed' if stream else 'whole'}: {args.requests * args.concurrency} requests x {tokens} tokens "
              f"per round, concurrency {args.concurrency}, {args.rounds} rounds")
        print("| endpoint | median tok/s | rounds | vs chat |")
        print("|---|---|---|---|")
        for shape in shapes:
            median = statistics.median(rates[shape])
            print(f"| {shape} | {median:.1f} | {' / '.join(f'{r:.1f}' for r in rates[shape])} | "
                  f"{100 * (median / base - 1):+.1f}% |")


if __name__ == "__main__":
    main()
