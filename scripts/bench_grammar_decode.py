#!/usr/bin/python3
"""bench_grammar_decode: decode speed with and without a JSON Schema constraint, through wafer serve.

Starts `wafer serve` on MODEL and sends the same greedy /v1/completions request (a fixed prompt, --tokens
tokens) plain and constrained by a schema whose answer cannot end early (a string of at least 400
characters), in rounds; each round runs both, in an order that alternates (ABBA), so slow drift on a
shared machine hits both alike. Decode speed is (completion tokens - 1) / (time of the last streamed chunk
- time of the first): the prompt's prefill is left out. Reports the median of the per-round ratios
(schema / plain) and the medians of each. The first round of each (cold mask cache, first trie build) is
a warm-up and not counted. Usage: bench_grammar_decode.py MODEL [--tokens N] [--rounds R] [--threads T]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
WAFER = os.environ.get("WAFER_BIN") or os.path.join(REPO, "build", "wafer")
SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 400, "maxLength": 4000},
                                           "n": {"type": "integer"}},
          "required": ["story", "n"], "additionalProperties": False}


def start_server(model, threads):
    log = tempfile.NamedTemporaryFile(prefix="wafer-grammar-bench-", suffix=".log", delete=False)
    data = tempfile.mkdtemp(prefix="wafer-grammar-bench-")
    args = [WAFER, "serve", "--model", model, "--port", "0", "--threads", str(threads), "--max-batch-size", "1",
            "--data-dir", data]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline:
        text = open(log.name, errors="replace").read()
        m = re.search(r"listening on (http://[\d.]+:\d+)", text)
        if m:
            try:
                if httpx.get(m.group(1) + "/ready", timeout=2).status_code == 200:
                    return proc, m.group(1)
            except httpx.HTTPError:
                pass
        if proc.poll() is not None:
            sys.exit("wafer serve exited:\n" + text)
        time.sleep(0.2)
    proc.kill()
    sys.exit("wafer serve did not become ready")


def run(client, body):
    """One streamed completion: decode tokens/s and the completion's token count."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    t_first = t_last = usage = None
    with client.stream("POST", "/v1/completions", json=body, timeout=1200) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            line = line.strip()
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                sys.exit("error event: %r" % ev)
            usage = ev.get("usage") or usage
            for ch in ev.get("choices", []):
                if ch.get("text"):
                    t_first = t_first or time.perf_counter()
                    t_last = time.perf_counter()
    n = usage["completion_tokens"]
    return (n - 1) / (t_last - t_first), n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    proc, base = start_server(a.model, a.threads)
    base_body = {"prompt": "Write a long story about a dragon.", "max_tokens": a.tokens, "temperature": 0}
    bodies = {"plain": dict(base_body, ignore_eos=True), "schema": dict(base_body, json_schema=SCHEMA)}
    res = {"plain": [], "schema": []}
    ratios = []
    try:
        with httpx.Client(base_url=base) as client:
            for rnd in range(a.rounds + 1):
                order = ["plain", "schema"] if rnd % 2 == 0 else ["schema", "plain"]
                got = {}
                for k in order:
                    tps, n = run(client, bodies[k])
                    if n != a.tokens:
                        sys.exit("%s generated %d tokens, not %d" % (k, n, a.tokens))
                    got[k] = tps
                load = open("/proc/loadavg").read().split()[0]
                print("round %d%s: plain %.2f tok/s, schema %.2f tok/s, ratio %.3f (load %s)" % (
                    rnd, " (warm-up)" if rnd == 0 else "", got["plain"], got["schema"], got["schema"] / got["plain"],
                    load), flush=True)
                if rnd == 0:
                    continue
                for k in got:
                    res[k].append(got[k])
                ratios.append(got["schema"] / got["plain"])
    finally:
        proc.terminate()
        proc.wait()
    print("median decode: plain %.2f tok/s, schema %.2f tok/s; median ratio schema/plain %.3f over %d rounds" % (
        statistics.median(res["plain"]), statistics.median(res["schema"]), statistics.median(ratios), len(ratios)))


if __name__ == "__main__":
    main()
