#!/usr/bin/env python3
"""Greedy text of real GGUF files in kvserve and in llama.cpp, prompt by prompt (issue #18).

For each file and prompt: llama.cpp's llama-server continues the prompt greedily (its native /completion,
with each step's top-2 log probabilities), `kvserve run` does the same, and the two texts are compared.
llama.cpp keeps its KV cache in f32 here, as kvserve does by default. Both engines round activations to 8 bits
by default, so they may part at a step where the top two tokens are nearly tied: each row gives llama.cpp's tokens before the first difference and llama.cpp's top-2 margin
(in log probability) where they part.

    python3 tools/reference/real_files_vs_llama_cpp.py BIN_DIR FILE.gguf... [--kvserve build/kvserve] [-n 32]

BIN_DIR is what ../shared/peers/llama-cpp.sh prints. Prints a markdown table. Standard library only.
"""
import argparse
import os
import subprocess

from llama_server import post, start

PROMPTS = [
    "def fibonacci(n):",
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
]


def llama_cpp_steps(bin_dir, path, prompts, n_predict, threads):
    """[(piece, top-2 margin)] per generated token, for each prompt."""
    server, url = start(bin_dir, path, ["-t", str(threads), "-c", "1024", "-np", "1", "-ctk", "f32", "-ctv", "f32"])
    try:
        out = []
        for prompt in prompts:
            answer = post(url + "/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0,
                                                "n_probs": 2, "cache_prompt": False})
            steps = []
            for entry in answer["completion_probabilities"]:
                top = [p["logprob"] for p in entry["top_logprobs"]]
                steps.append((entry["token"], top[0] - top[1] if len(top) > 1 else float("inf")))
            out.append(steps)
        return out
    finally:
        server.terminate()
        server.wait()


def kvserve_text(kvserve, path, prompt, n_predict, threads):
    run = subprocess.run([kvserve, "run", "-m", path, "-p", prompt, "-n", str(n_predict), "--temp", "0",
                          "-t", str(threads), "--no-echo"], capture_output=True, text=True, check=True)
    return run.stdout.rstrip("\n")


def agreement(steps, text):
    """(llama.cpp's tokens that kvserve's text also starts with, llama.cpp's top-2 margin where they part).

    Texts are compared, not token ids: where kvserve picked a longer token that starts with llama.cpp's (' "'
    against ' '), the text parts one step later, so the margin is the smaller of that step's and the one before.
    """
    position = 0
    for i, (piece, margin) in enumerate(steps):
        if text[position:position + len(piece)] != piece:
            # kvserve may also have stopped early, at an end-of-generation token llama.cpp did not pick
            return i, min(margin, steps[i - 1][1]) if i > 0 else margin
        position += len(piece)
    return len(steps), None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bin_dir")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--kvserve", default="build/kvserve")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-t", type=int, default=2)
    args = ap.parse_args()
    print("| file | prompt | tokens equal | llama.cpp's top-2 margin at the first difference |")
    print("|---|---|---:|---:|")
    for path in args.files:
        per_prompt = llama_cpp_steps(args.bin_dir, path, PROMPTS, args.n, args.t)
        for prompt, steps in zip(PROMPTS, per_prompt):
            equal, margin = agreement(steps, kvserve_text(args.kvserve, path, prompt, args.n, args.t))
            shown = "-" if margin is None else f"{margin:.3f}"
            print(f"| {os.path.basename(path)} | `{prompt[:24]}` | {equal} of {len(steps)} | {shown} |", flush=True)


if __name__ == "__main__":
    main()
