#!/usr/bin/env python3
"""Data-parallel replicas behind SGLang's router (ctest `cluster`, docs/scaling.md).

scripts/cluster.sh starts 3 `kvserve serve` replicas of a tiny model and the router
(--policy cache_aware) on loopback; this checks, with the standard library only:
  - nothing listens on an address but 127.0.0.1 (replicas, router, router metrics);
  - greedy answers through the router equal a single server's (completions, chat, streamed);
  - requests sharing a long prefix land on one replica (its prefix-hit counter in /metrics
    grows, the others' do not) while unrelated ones spread over the replicas;
  - a replica killed mid-run: the requests in flight and the new ones still succeed through
    the others (the router retries); one that hangs (SIGSTOP) delays a request by the router's
    request timeout at most, then it is retried; with every replica down the client gets an
    HTTP error at once, not a hang; SIGTERM to cluster.sh stops every process it started;
  - the cluster's API key (KVSERVE_API_KEY to cluster.sh) is required by the router and every
    replica, and appears on no command line of the processes cluster.sh started.

Usage: cluster_test.py KVSERVE_BINARY [MODEL]   (default models/stories260k.gguf)
Exits 77 (skipped) without the model or the router package (pip install smg; $PYTHON, default python3).
"""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = 77
REQUEST_TIMEOUT = 5  # the router's, for a replica that hangs (every answer here takes well under a second)
T0 = time.monotonic()
API_KEY = "cluster-test-" + "".join(random.Random().choice("abcdefghijklmnopqrstuvwxyz") for _ in range(16))


def log(msg):
    print(f"[{time.monotonic() - T0:5.1f} s] {msg}", flush=True)


def http(method, url, body=None, timeout=30, key=API_KEY):
    """(status, body text); status -1 with the reason when no answer came. Sends the cluster's key
    (the single server has none and ignores it)."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError) as e:
        return -1, str(e)


def metrics(url):
    status, text = http("GET", url + "/metrics", timeout=10)
    assert status == 200, f"{url}/metrics: {status} {text[:200]}"
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def listening_addresses(pid):
    """Local addresses of the TCP sockets the process listens on (from /proc)."""
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            next(f)
            for row in f:
                cols = row.split()
                if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                    continue
                addr, port = cols[1].split(":")
                if v6:
                    found.append(("[" + addr + "]", int(port, 16)))
                else:
                    ip = ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0))
                    found.append((ip, int(port, 16)))
    return found


class Cluster:
    def __init__(self, kvserve, model, logs, policy="cache_aware"):
        env = dict(os.environ, KVSERVE_CLUSTER_LOGS=logs, KVSERVE_API_KEY=API_KEY)
        self.proc = subprocess.Popen(
            [os.path.join(ROOT, "scripts/cluster.sh"), "-n", "3", "-m", model, "--port", "0", "-t", "1",
             "--policy", policy, "--kvserve", kvserve, "--request-timeout", str(REQUEST_TIMEOUT),
             "--", "--max-running", "4"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        self.replicas = []  # (url, pid)
        self.router = None
        self.router_pid = None
        deadline = time.monotonic() + 90
        lines = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            words = line.split()
            if line.startswith("replica "):
                self.replicas.append((words[2], int(words[4])))
            elif line.startswith("router: "):
                self.router, self.router_pid = words[1], int(words[3])
            elif line.startswith("ready: "):
                return
        self.stop()
        raise AssertionError("cluster.sh did not get ready:\n" + "".join(lines))

    def stop(self, timeout=20):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise AssertionError("cluster.sh did not stop within 20 s of SIGTERM")


def start_single(kvserve, model, log_path):
    log_file = open(log_path, "w")
    env = {k: v for k, v in os.environ.items() if k != "KVSERVE_API_KEY"}
    proc = subprocess.Popen([kvserve, "serve", "-m", model, "--port", "0", "-t", "1"], stdout=log_file,
                            stderr=subprocess.STDOUT, env=env)
    for _ in range(300):
        with open(log_path) as f:
            text = f.read()
        if " on http://" in text:
            return proc, text.split(" on ", 1)[1].split()[0]
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the single server did not start:\n" + open(log_path).read())


def wait_until_unhealthy(router, worker_url, deadline):
    """Waits until the router's /workers lists worker_url as unhealthy or not at all."""
    while time.monotonic() < deadline:
        status, text = http("GET", router + "/workers", timeout=5)
        if status == 200:
            workers = json.loads(text).get("workers", [])
            if not any(w.get("url") == worker_url and w.get("is_healthy") for w in workers):
                return
        time.sleep(0.1)
    raise AssertionError(f"the router still lists {worker_url} as healthy after its process was killed")


def completion(url, model_id, prompt, max_tokens=16, stream=False):
    body = {"model": model_id, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    status, text = http("POST", url + "/v1/completions", body)
    assert status == 200, f"{url}: {status} {text[:300]}"
    if not stream:
        return json.loads(text)["choices"][0]["text"]
    pieces = []
    for event in text.split("\n\n"):
        if event.startswith("data: ") and event[6:] != "[DONE]":
            pieces += [c["text"] for c in json.loads(event[6:])["choices"]]
    assert "data: [DONE]" in text, text[-200:]
    return "".join(pieces)


def chat(url, model_id, content, max_tokens=16):
    body = {"model": model_id, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0}
    status, text = http("POST", url + "/v1/chat/completions", body)
    assert status == 200, f"{url}: {status} {text[:300]}"
    return json.loads(text)["choices"][0]["message"]["content"]


def deltas(before, after, name):
    return [a.get(name, 0) - b.get(name, 0) for b, a in zip(before, after)]


WORDS = ("apple river stone cloud happy green little bird tree window garden yellow sunny music dance "
         "pencil ocean friend castle dragon rabbit cookie flower summer winter forest candle blanket").split()


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    kvserve = sys.argv[1]
    model = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "models/stories260k.gguf")
    py = os.environ.get("PYTHON", "python3")
    # smg: cluster.sh also runs the older sglang-router, whose cache_aware sent every unrelated
    # request of a sequential run to one replica (docs/scaling.md), which the spread check would fail.
    if subprocess.run([py, "-c", "import smg"], capture_output=True).returncode:
        print("skipped: no router package (pip install smg)")
        return SKIP

    logs = tempfile.mkdtemp(prefix="kvserve-cluster-")
    if not os.path.exists(model):
        # stories260k comes from ../shared (absent on a user's machine): a random-weight model as small, with
        # room for the shared-prefix prompts (the checks compare servers with each other, not with a text).
        log(f"{model} not found: using a random-weight tiny-llama (kvserve synth)")
        model = os.path.join(logs, "tiny-llama.gguf")
        subprocess.run([kvserve, "synth", "--preset", "tiny-llama", "--context", "2048", "-o", model],
                       check=True, capture_output=True)
    single, single_url = start_single(kvserve, model, os.path.join(logs, "single.log"))
    cluster = None
    try:
        cluster = Cluster(kvserve, model, logs)
        urls = [u for u, _ in cluster.replicas]
        log(f"router {cluster.router}, replicas {urls}, single server {single_url}")

        # Nothing listens beyond 127.0.0.1.
        for pid in [p for _, p in cluster.replicas] + [cluster.router_pid]:
            addrs = listening_addresses(pid)
            assert addrs, f"pid {pid} listens on nothing"
            assert all(a == "127.0.0.1" for a, _ in addrs), f"pid {pid} listens on {addrs}"
        model_id = json.loads(http("GET", single_url + "/v1/models")[1])["data"][0]["id"]

        # The key: required by the router and the replicas, on no command line.
        for pid in [p for _, p in cluster.replicas] + [cluster.router_pid, cluster.proc.pid]:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                assert API_KEY.encode() not in f.read(), f"pid {pid} has the API key on its command line"
        # (smg answers GET /v1/models to anyone; it requires the key on the generation routes.)
        for url in [cluster.router] + urls:
            status, text = http("POST", url + "/v1/completions", {"model": model_id, "prompt": "a", "max_tokens": 1},
                                key=None)
            assert status == 401, f"{url} without the key: {status} {text[:200]}"
        log("API key required by the router and every replica, on no command line")

        # Greedy through the router = a single server's.
        prompts = ["Once upon a time", "The little dog", "Lily and Ben went to the park", "One day, a big bird"]
        for p in prompts:
            want = completion(single_url, model_id, p, 24)
            assert completion(cluster.router, model_id, p, 24) == want, p
            assert completion(cluster.router, model_id, p, 24, stream=True) == want, p
        assert chat(cluster.router, model_id, "Tell me a story") == chat(single_url, model_id, "Tell me a story")
        log(f"greedy: {len(prompts)} prompts x (whole, streamed) + chat equal to the single server")

        # A long shared prefix lands on one replica; its prefix-hit counter shows it.
        prefix = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. "
                  "One day, she saw a big red ball in the park. She ran to the ball and picked it up. "
                  "Her friend Tom came to play with her. They threw the ball high into the sky and laughed. "
                  "Then the ball fell into a tree. Lily was sad, but Tom had an idea. He found a long stick and "
                  "pushed the ball down. Lily hugged Tom and said thank you. They played until the sun went down. "
                  "The next morning, Lily woke up early. She put on her shoes and ran to the garden to see "
                  "the flowers. A small cat was sleeping under the bench, and a bird sang in the tree. ")
        prefix_tokens = len(json.loads(http("POST", single_url + "/tokenize", {"content": prefix})[1])["tokens"])
        before = [metrics(u) for u in urls]
        for i in range(6):
            completion(cluster.router, model_id, prefix + f"Then {WORDS[i]} said", 8)
        after = [metrics(u) for u in urls]
        served = deltas(before, after, "kvserve_requests_finished_total")
        hits = deltas(before, after, "kvserve_prefix_cache_hit_tokens_total")
        log(f"shared prefix ({prefix_tokens} tokens) x 6: requests per replica {served}, prefix-hit tokens {hits}")
        holder = max(range(3), key=lambda i: served[i])
        assert served[holder] == 6 and sum(served) == 6, served
        # Every request after the first finds the prefix's full 16-token blocks (the first may hit earlier ones).
        assert hits[holder] >= 5 * (prefix_tokens // 16 * 16 - 16), hits
        assert all(hits[i] == 0 for i in range(3) if i != holder), hits
        assert after[holder][f'vllm:prefix_cache_hits_total{{model_name="{model_id}"}}'] == \
            after[holder]["kvserve_prefix_cache_hit_tokens_total"]

        # Unrelated prompts spread.
        rng = random.Random(7)
        before = [metrics(u) for u in urls]
        for i in range(9):
            words = rng.sample(WORDS, 6)
            completion(cluster.router, model_id, f"{i} {' '.join(words)}", 4)
        after = [metrics(u) for u in urls]
        spread = deltas(before, after, "kvserve_requests_finished_total")
        log(f"9 unrelated prompts: requests per replica {spread}")
        assert sum(spread) == 9 and sum(1 for n in spread if n > 0) >= 2, spread

        # Kill the prefix holder while requests that want it (and others) are in flight.
        expected = {}
        jobs = [prefix + f"Then {WORDS[i % len(WORDS)]} said" for i in range(6, 18)] + \
               [" ".join(random.Random(i).sample(WORDS, 5)) for i in range(100, 106)]
        for p in jobs:
            expected[p] = completion(single_url, model_id, p, 12)
        results = {}
        failures = []

        def worker(items):
            for p in items:
                try:
                    results[p] = completion(cluster.router, model_id, p, 12)
                except AssertionError as e:
                    failures.append(f"{p[-20:]!r}: {e}")

        threads = [threading.Thread(target=worker, args=(jobs[i::3],)) for i in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(results) + len(failures) < 4 and time.monotonic() < deadline:
            time.sleep(0.005)
        victim_url, victim_pid = cluster.replicas[holder]
        os.kill(victim_pid, signal.SIGKILL)
        log(f"killed replica {holder + 1} ({victim_url}) after {len(results)} of {len(jobs)} answers")
        for t in threads:
            t.join(timeout=60)
        assert not failures, failures
        assert results == expected, "answers through the router changed after a replica died"
        after_kill = [f"{prefix}And {w} ran" for w in WORDS[:6]]
        for p in after_kill:
            assert completion(cluster.router, model_id, p, 8) == completion(single_url, model_id, p, 8)
        log(f"{len(jobs)} requests in flight and {len(after_kill)} new ones all answered after the kill")

        # A replica that hangs without dying (SIGSTOP): requests sent to it end at the router's request
        # timeout and are retried on the other one; the health checks then take it out of the pool.
        # Stopped: the survivor that served an anchor prompt, so that the router's tree sends its followers there.
        # First the health checks take the killed replica out: while the router still lists it, a new prompt can
        # be routed (and recorded in the router's tree) there, fail at once and be retried elsewhere, and then
        # its followers never reach the replica stopped below (one CI run: all four answered in 0.07 s).
        wait_until_unhealthy(cluster.router, victim_url, deadline=time.monotonic() + 30)
        anchor = "Zebra " + " ".join(random.Random(300).sample(WORDS, 12))
        before = [metrics(u) if i != holder else {} for i, u in enumerate(urls)]
        completion(cluster.router, model_id, anchor, 4)
        served = [metrics(u)["kvserve_requests_finished_total"] - b["kvserve_requests_finished_total"]
                  if i != holder else 0 for i, (u, b) in enumerate(zip(urls, before))]
        stopped = served.index(1)
        os.kill(cluster.replicas[stopped][1], signal.SIGSTOP)
        # The followers go out together: the router's tree sends them to the stopped replica, and if it balances
        # by load instead (a dead replica's in-flight count can leave the loads looking uneven for a while, and one
        # CI run sent four sequential followers to the survivor), concurrent requests still reach the stopped one.
        followers = [f"{anchor} and {w}" for w in WORDS[:4]]
        wanted = {p: completion(single_url, model_id, p, 6) for p in followers}
        latencies, answers, errors = {}, {}, []

        def follower(p):
            t = time.monotonic()
            try:
                answers[p] = completion(cluster.router, model_id, p, 6)
            except AssertionError as e:
                errors.append(f"{p[-20:]!r}: {e}")
            latencies[p] = time.monotonic() - t

        start = time.monotonic()
        threads = [threading.Thread(target=follower, args=(p,)) for p in followers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=12 * REQUEST_TIMEOUT)
        assert not errors, errors
        assert answers == wanted, "answers changed while a replica hung"
        slowest = max(latencies.values())
        log(f"replica {stopped + 1} stopped (SIGSTOP): 4 concurrent requests that follow its prefix answered in "
            f"{time.monotonic() - start:.1f} s, the slowest in {slowest:.1f} s (router timeout {REQUEST_TIMEOUT} s)")
        # At least one went to the stopped replica, waited out the timeout and was retried.
        assert REQUEST_TIMEOUT - 0.5 <= slowest < 6 * REQUEST_TIMEOUT, slowest
        assert slowest < 6 * REQUEST_TIMEOUT, slowest

        # Every replica down: an HTTP error at once, not a hang.
        for i, (_, pid) in enumerate(cluster.replicas):
            if i != holder:
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)  # the stopped one dies too
        start = time.monotonic()
        status, text = http("POST", cluster.router + "/v1/completions",
                            {"model": model_id, "prompt": "hello", "max_tokens": 4}, timeout=30)
        took = time.monotonic() - start
        log(f"all replicas down: HTTP {status} in {took:.2f} s: {text[:160]}")
        assert status >= 500 and took < 10, (status, took)
        assert "error" in json.loads(text), text
    finally:
        single.terminate()
        single.wait(timeout=20)
        if cluster:
            started = [p for _, p in cluster.replicas] + ([cluster.router_pid] if cluster.router_pid else [])
            cluster.stop()
            for _ in range(100):
                alive = [p for p in started if os.path.exists(f"/proc/{p}") and
                         open(f"/proc/{p}/stat").read().split()[2] != "Z"]
                if not alive:
                    break
                time.sleep(0.1)
            assert not alive, f"still running after cluster.sh stopped: {alive}"
            log("cluster.sh stopped every process it started")
    print(f"cluster test passed in {time.monotonic() - T0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
