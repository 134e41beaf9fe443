#!/usr/bin/env python3
"""Records llama-server's greedy /infill answers on the Qwen2.5-Coder files into
tests/data/fim_llama_server.json, the reference tests/infill_test.cpp compares
kvserve's /infill with.

Usage: tools/record_fim_llama_server.py LLAMA_SERVER_BINARY [MODELS_DIR]
(LLAMA_SERVER_BINARY from ../shared/peers/llama-cpp.sh; MODELS_DIR defaults to models/)
"""
import json
import os
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["qwen2.5-coder-0.5b-instruct.gguf", "qwen2.5-coder-1.5b-instruct.gguf"]
PORT = 8291
CASES = [
    {"input_prefix": "def fibonacci(n):\n    ", "input_suffix": "\n    return result\n", "n_predict": 32},
    {"input_prefix": "import os\n\ndef list_python_files(folder):\n    ",
     "input_suffix": "\n\nif __name__ == \"__main__\":\n    print(list_python_files(\".\"))\n",
     "prompt": "files = ", "n_predict": 32},
    {"input_prefix": "from util import clamp\n\ndef scale(values, factor):\n    ",
     "input_suffix": "\n",
     "input_extra": [{"filename": "util.py", "text": "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n"},
                     {"filename": "README.md", "text": "Scale lists of numbers, clamped to [0, 1].\n"}],
     "n_predict": 32},
    {"input_prefix": "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n        ",
     "input_suffix": "", "n_predict": 24},
]


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def wait_healthy(proc):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit("llama-server exited early")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit("llama-server did not start")


def main():
    server = sys.argv[1]
    models_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "models")
    command = (f"llama-server -m MODEL -c 4096 -np 1 -t 2 --port {PORT}; POST /infill with each request "
               f"plus temperature 0 and n_probs 2 (tools/record_fim_llama_server.py, llama.cpp from llama-cpp-python 0.3.36)")
    out = {"command": command, "models": []}
    for name in MODELS:
        path = os.path.join(models_dir, name)
        if not os.path.exists(path):
            print("skipping", name, "(not found)")
            continue
        proc = subprocess.Popen([server, "-m", path, "-c", "4096", "-np", "1", "-t", "2", "--port", str(PORT)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_healthy(proc)
            cases = []
            for case in CASES:
                request = dict(case, temperature=0)
                answer = post("/infill", dict(request, n_probs=2))
                # Each generated token with the gap between its two most likely tokens (nats): where the gap
                # is tiny, the rounding of another engine's kernels may pick the other one.
                margins = [[p["token"], p["top_logprobs"][0]["logprob"] - p["top_logprobs"][1]["logprob"]]
                           for p in answer["completion_probabilities"]]
                cases.append({"request": request,
                              "llama_server": {k: answer[k] for k in ("content", "tokens_evaluated", "tokens_predicted",
                                                                      "stop_type")},
                              "margins": margins})
                print(name, repr(answer["content"][:60]))
            out["models"].append({"file": name, "cases": cases})
        finally:
            proc.terminate()
            proc.wait()
    with open(os.path.join(ROOT, "tests", "data", "fim_llama_server.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
