#!/usr/bin/env python3
"""Whole kvserve processes under mpirun (docs/scaling.md): `run -f` and `run -p`
pipelined over 2 ranks (and `run -f` over 3) print the text of one process; a rank killed (SIGKILL)
or stopped (SIGSTOP) while `serve` runs ends every rank with a clear error
within seconds, never a hang. Usage: pipeline_failure_test.py KVSERVE MPIRUN"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

KVSERVE, MPIRUN = sys.argv[1], sys.argv[2]
MPI = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2"]
MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(args, timeout=120):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def compare_run(model, tmp):
    prompts = os.path.join(tmp, "prompts.txt")
    with open(prompts, "w") as f:
        f.write("Once upon a time\nThe little dog\nLily and Ben went to the park\n")
    common = ["-m", model, "-n", "24", "--temp", "0", "-t", "1", "--parallel", "3"]
    one = run([KVSERVE, "run", "-f", prompts] + common)
    two = run(MPI + [KVSERVE, "run", "-f", prompts, "--pipeline-parallel", "2"] + common)
    check(one.returncode == 0 and two.returncode == 0, "run -f exits 0 alone and pipelined: " + two.stderr[-400:])
    check(one.stdout == two.stdout and one.stdout.count("###") == 3, "run -f: the same text on 2 ranks as in one process")
    check("pipeline rank 1 of 2" in two.stderr and "bytes sent" in two.stderr, "each rank reports its layers and bytes")
    three = run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "3", KVSERVE, "run", "-f", prompts,
                 "--pipeline-parallel", "3"] + common)
    check(three.returncode == 0 and three.stdout == one.stdout, "run -f: the same text on a chain of 3 ranks: "
          + three.stderr[-300:])
    p_one = run([KVSERVE, "run", "-p", "Once upon a time"] + common)
    p_two = run(MPI + [KVSERVE, "run", "-p", "Once upon a time", "--pipeline-parallel", "2"] + common)
    check(p_two.returncode == 0 and p_one.stdout == p_two.stdout, "run -p: the same text on 2 ranks: %r vs %r"
          % (p_one.stdout[-80:], p_two.stdout[-80:]))


def start_server(model, extra):
    proc = subprocess.Popen(MPI + [KVSERVE, "serve", "-m", model, "--port", "0", "-t", "1", "--pipeline-parallel", "2"]
                            + extra, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url, pid, lines = None, None, []
    deadline = time.time() + 60
    while time.time() < deadline and (url is None or pid is None):
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"on (http://[0-9.]+:\d+)", line)
        url = m.group(1) if m else url
        m = re.search(r"pipeline rank 1 of 2 \(pid (\d+)\)", line)
        pid = int(m.group(1)) if m else pid
    rest = []
    threading.Thread(target=lambda: rest.extend(proc.stdout), daemon=True).start()
    return proc, url, pid, lines, rest


def completion(url, max_tokens):
    body = json.dumps({"model": "m", "prompt": "Once upon a time", "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except Exception as e:  # the server went away mid-request
        return None, str(e)


def lose_rank(model, how, sig):
    proc, url, pid, lines, rest = start_server(model, ["--pipeline-timeout", "2"])
    try:
        check(url is not None and pid is not None, how + ": the pipelined server starts: " + "".join(lines)[-500:])
        if url is None or pid is None:
            return
        status, body = completion(url, 8)
        check(status == 200, how + ": a request answers 200 before: %s %s" % (status, body[:200]))
        os.kill(pid, sig)
        start = time.time()
        status, body = completion(url, 8)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        took = time.time() - start
        out = "".join(lines + rest)
        check(proc.returncode not in (None, 0), how + ": every rank ends (mpirun exit %s) in %.1f s" % (proc.returncode, took))
        check(took < 20, how + ": within 20 s (%.1f s)" % took)
        return status, body, out
    finally:
        if proc.poll() is None:
            proc.kill()
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, TypeError):
            pass


def main():
    with tempfile.TemporaryDirectory() as tmp:
        real = os.path.join(MODELS, "stories260k.gguf")
        tiny = os.path.join(tmp, "tiny.gguf")
        # Three layers: the chain of 3 ranks needs one layer per rank (without ../shared there is no stories260k).
        run([KVSERVE, "synth", "--preset", "tiny-llama", "--layers", "3", "-o", tiny]).check_returncode()
        compare_run(real if os.path.exists(real) else tiny, tmp)
        result = lose_rank(tiny, "SIGKILL", signal.SIGKILL)
        if result:
            check("exited on signal 9" in result[2] or "rank 1" in result[2],
                  "SIGKILL: mpirun or rank 0 names the lost rank: " + result[2][-600:])
        result = lose_rank(tiny, "SIGSTOP", signal.SIGSTOP)
        if result:
            status, body, out = result
            check("within 2000 ms" in out, "SIGSTOP: rank 0 says it heard nothing within --pipeline-timeout: " + out[-600:])
            check(status != 200 or "error" in body, "SIGSTOP: the request in flight fails: %s %s" % (status, body[:300]))
    print("%d failures" % len(failures))
    sys.exit(1 if failures else 0)


main()
