#!/usr/bin/env python3
"""What models mode of wafer serve costs (docs/models.md): the time to the first answer on a cold model (the
child's start, the model's load, /ready polled, then one token), and the latency the manager's proxy adds to
a warm model, against the same child called directly on its loopback port.

One client, keep-alive, TCP_NODELAY, each request written in one send (so neither side's delayed ACK is
measured), a 1-token greedy completion; the direct and proxied paths alternate over --rounds rounds of
--n requests; p50 and p90 of each, and the p50 difference, are printed.

    /usr/bin/python3 scripts/bench_models.py --wafer build/wafer --model ../shared/models/stories260K/stories260K.gguf
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request


def conn(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def request(s, model):
    body = json.dumps({"model": model, "prompt": "Once upon a time", "max_tokens": 1, "temperature": 0}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    n = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
    while len(rest) < n:
        rest += s.recv(65536)
    if b" 200 " not in head.split(b"\r\n")[0]:
        raise RuntimeError(head.decode(errors="replace") + rest.decode(errors="replace"))


def latencies(port, model, n):
    s = conn(port)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        request(s, model)
        out.append(time.perf_counter() - t0)
    s.close()
    out.sort()
    return out[n // 2] * 1000, out[int(n * 0.9)] * 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wafer", default="build/wafer")
    ap.add_argument("--model", required=True)
    ap.add_argument("--kv-memory", default="16MiB")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-models-")
    cfg = os.path.join(tmp, "models.yaml")
    with open(cfg, "w") as f:
        f.write(f"models:\n  - {{name: m, path: {os.path.abspath(a.model)}, kv_memory: {a.kv_memory}}}\n")
    log_path = os.path.join(tmp, "serve.log")
    with open(log_path, "w") as log:
        p = subprocess.Popen([a.wafer, "serve", "--config", cfg, "--port", "0", "--threads", "1"], stdout=log,
                             stderr=subprocess.STDOUT)
    try:
        port = None
        for _ in range(500):
            m = re.search(r"models: listening on http://[\d.]+:(\d+)", open(log_path).read())
            if m:
                port = int(m.group(1))
                break
            time.sleep(0.02)
        if not port:
            raise SystemExit("wafer serve did not start:\n" + open(log_path).read())
        t0 = time.monotonic()
        request(conn(port), "m")
        print(f"cold first answer: {(time.monotonic() - t0) * 1000:.0f} ms (start the child, load, /ready, 1 token)")
        child = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/models"))["data"][0]["port"]
        for r in range(a.rounds):
            d = latencies(child, "m", a.n)
            v = latencies(port, "m", a.n)
            print(f"round {r}: direct p50 {d[0]:.3f} p90 {d[1]:.3f} ms; through the manager p50 {v[0]:.3f} "
                  f"p90 {v[1]:.3f} ms; added p50 {v[0] - d[0]:.3f} ms")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)


if __name__ == "__main__":
    main()
