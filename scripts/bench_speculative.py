#!/usr/bin/python3
"""bench_speculative: decode speed with and without speculative decoding, through wafer serve.

Starts `wafer serve` on MODEL (or uses --url), takes the model's own greedy continuation T of --tokens tokens
after a fixed prompt, then sends the same greedy request with each draft source, in rounds, the order of
the sources shuffled within a round (the machine is shared and noisy: every source is compared with the
plain run of its own round, and the report gives the median of those ratios):

  plain    no speculation
  exact    prediction = T (an edit that changes nothing: the ceiling)
  half     prediction = T with every other chunk of 6 words replaced
  wrong    prediction = T's words in reverse order (the prediction realigns on a word and drafts the wrong
           continuation: drafts verified and rejected)
  other    prediction = an unrelated text (another prompt's continuation: hardly anything to draft)
  ngram    n-gram drafts over the prompt and the text so far, no prediction

Every answer must equal T (speculation never changes the output); the script fails otherwise. Decode speed
is (completion tokens - 1) / (time of the last streamed chunk - time of the first), so the prompt's
prefill is left out. With --concurrency C each measure sends C copies of the request at once and reports
their mean decode speed (speculation under load). Usage: bench_speculative.py MODEL [--tokens N]
[--rounds R] [--threads T] [--url URL] [--draft-fixed] [--prompt TEXT] [--concurrency C] [--json]
"""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
WAFER = os.environ.get("WAFER_BIN") or os.path.join(REPO, "build", "wafer")


def start_server(model, threads, extra):
    log = tempfile.NamedTemporaryFile(prefix="wafer-spec-bench-", suffix=".log", delete=False)
    args = [WAFER, "serve", "--model", model, "--port", "0", "--threads", str(threads), "--max-batch-size", "4"]
    # its own batch-jobs data dir: another wafer process on the machine may hold the default one
    args += ["--data-dir", tempfile.mkdtemp(prefix="wafer-spec-bench-data-")]
    proc = subprocess.Popen(args + extra, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    base = None
    while time.time() < deadline:
        text = open(log.name, errors="replace").read()
        m = re.search(r"listening on (http://[\d.]+:\d+)", text)
        if m:
            base = m.group(1)
        if base:
            try:
                if httpx.get(base + "/ready", timeout=2).status_code == 200:
                    return proc, base, log.name
            except httpx.HTTPError:
                pass
        if proc.poll() is not None:
            sys.exit("wafer serve exited:\n" + text)
        time.sleep(0.1)
    proc.kill()
    sys.exit("wafer serve did not become ready")


def run(client, body):
    """One streamed completion: (text, decode tokens/s, usage)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    text, t_first, t_last, usage = "", None, None, None
    with client.stream("POST", "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            line = line.strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            try:
                ev = json.loads(line[6:])
            except ValueError:
                sys.exit("bad event: %r" % line)
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                if ch.get("text"):
                    now = time.perf_counter()
                    t_first = t_first or now
                    t_last = now
                    text += ch["text"]
    n = usage["completion_tokens"]
    tps = (n - 1) / (t_last - t_first) if t_last and t_last > t_first else float("nan")
    return text, tps, usage


def run_many(client, body, c):
    """c copies of body at once: (texts, mean decode tokens/s, usages)."""
    if c == 1:
        text, tps, usage = run(client, body)
        return [text], tps, [usage]
    out = [None] * c

    def one(i):
        out[i] = run(client, body)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(c)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return [o[0] for o in out], statistics.mean(o[1] for o in out), [o[2] for o in out]


def edit_half(text, chunk=6):
    words = text.split(" ")
    out = []
    for i, w in enumerate(words):
        out.append(w if (i // chunk) % 2 == 0 else "changed")
    return " ".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?")
    ap.add_argument("--url")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", default="Here is the text to repeat:")
    ap.add_argument("--draft-fixed", action="store_true", help="serve --draft-fixed true (no adaptive lengths)")
    ap.add_argument("--sources", default="plain,exact,half,wrong,other,ngram")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not a.url and not a.model:
        ap.error("MODEL or --url is required")
    proc = None
    if a.url:
        base = a.url
    else:
        extra = ["--draft-fixed", "true"] if a.draft_fixed else []
        proc, base, _ = start_server(a.model, a.threads, extra)
    try:
        client = httpx.Client(base_url=base, timeout=600)
        req = {"prompt": a.prompt, "max_tokens": a.tokens, "temperature": 0}
        # the reference, twice (the first pages the weights in and measures the passes' costs)
        ref, _, _ = run(client, req)
        ref2, _, _ = run(client, req)
        assert ref == ref2, "greedy output changed between two identical requests"
        other, _, _ = run(client, dict(req, prompt="A completely different beginning"))
        bodies = {
            "plain": req,
            "exact": dict(req, prediction={"type": "content", "content": ref}),
            "half": dict(req, prediction={"type": "content", "content": edit_half(ref)}),
            "wrong": dict(req, prediction={"type": "content", "content": " ".join(reversed(ref.split(" ")))}),
            "other": dict(req, prediction={"type": "content", "content": other}),
            "ngram": dict(req, speculation="ngram"),
        }
        sources = a.sources.split(",")
        rng = random.Random(1)
        tps = {s: [] for s in sources}
        acc = {s: [0, 0] for s in sources}
        for rnd in range(a.rounds):
            order = list(sources)
            rng.shuffle(order)
            for s in order:
                texts, t, usages = run_many(client, bodies[s], a.concurrency)
                for text in texts:
                    if text != ref:
                        sys.exit(f"source {s}: the answer differs from the plain one:\n{text!r}\n{ref!r}")
                tps[s].append(t)
                for usage in usages:
                    d = usage["completion_tokens_details"]
                    acc[s][0] += d["draft_tokens"]
                    acc[s][1] += d["accepted_draft_tokens"]
        rows = []
        for s in sources:
            ratios = [t / p for t, p in zip(tps[s], tps["plain"])] if "plain" in tps else []
            rows.append({
                "source": s,
                "tok_s_median": statistics.median(tps[s]),
                "ratio_median": statistics.median(ratios) if ratios else None,
                "ratios": [round(r, 3) for r in ratios],
                "draft_tokens": acc[s][0],
                "accepted_tokens": acc[s][1],
            })
        print(f"{a.tokens} tokens, {a.rounds} rounds, {'fixed' if a.draft_fixed else 'adaptive'} drafts, "
              f"{a.concurrency} at once, model {a.model or a.url}")
        print("| source | decode tok/s (median) | vs plain (median of ratios) | ratios | drafted | accepted |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            ratio = "%.2fx" % r["ratio_median"] if r["ratio_median"] else ""
            print(f"| {r['source']} | {r['tok_s_median']:.2f} | {ratio} | {' '.join('%.2f' % x for x in r['ratios'])} "
                  f"| {r['draft_tokens']} | {r['accepted_tokens']} |")
        if a.json:
            print(json.dumps({"tokens": a.tokens, "rounds": a.rounds, "rows": rows}))
    finally:
        if proc:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
