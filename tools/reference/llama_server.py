"""Starting llama.cpp's llama-server and talking to it, for the reference tools here. Standard library only."""
import json
import os
import socket
import subprocess
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=300):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def start(bin_dir, model, args):
    """llama-server on `model` with `args` on a free port, once it answers /health: (process, base URL)."""
    port = free_port()
    server = subprocess.Popen([os.path.join(bin_dir, "llama-server"), "-m", model, "--port", str(port), *args],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.1)
    return server, url
