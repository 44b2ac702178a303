#!/usr/bin/python3
"""bench_jobs: what batch jobs cost live traffic, and how fast a batch runs, on one wafer serve (docs/jobs.md).

Starts `wafer serve` on MODEL with --max-batch-size B and measures, in rounds (the machine is shared and
noisy: each round compares its own A and B, run back to back in an order that alternates between rounds,
and the report gives the median of the per-round ratios):

  (a) live TTFT p95: `wafer bench serve` at --live-concurrency C (streaming, --live-prompts requests) on an
      idle server, and the same live load while a batch keeps every free slot busy (the batch is cancelled
      and the server idle again before the next measure). Target: ratio <= 1.25.
  (b) batch throughput: --batch-lines requests as one batch on an otherwise idle server (output tokens per
      second from POST /v1/batches until every line is committed), and the same requests (--dataset, the
      same prompts and max_tokens, ignore_eos, temperature 0) sent by `wafer bench serve` at concurrency B
      (full concurrency: every slot busy). Target: ratio >= 0.90.

Usage: bench_jobs.py MODEL [--rounds R] [--threads T] [--max-batch-size B] [--json FILE]
Prints the figures with the CPU and the load average, and a Markdown table for docs/jobs.md.
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
WAFER = os.environ.get("WAFER_BIN") or os.path.join(REPO, "build", "wafer")


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


class Serve:
    def __init__(self, model, threads, batch, extra):
        self.log = tempfile.NamedTemporaryFile(prefix="wafer-jobs-bench-", suffix=".log", delete=False).name
        self.data = tempfile.mkdtemp(prefix="wafer-jobs-bench-")
        args = [WAFER, "serve", "--model", model, "--port", "0", "--threads", str(threads), "--max-batch-size",
                str(batch), "--data-dir", self.data, "--max-queue", "100000"] + extra
        self.proc = subprocess.Popen(args, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        self.base = None
        while time.time() < deadline:
            text = open(self.log, errors="replace").read()
            m = re.search(r"listening on (http://[\d.]+:\d+)", text)
            if m:
                self.base = m.group(1)
                try:
                    if httpx.get(self.base + "/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
            if self.proc.poll() is not None:
                sys.exit("wafer serve exited:\n" + text)
            time.sleep(0.1)
        else:
            self.close()
            sys.exit("wafer serve did not become ready")
        self.c = httpx.Client(base_url=self.base, timeout=120)
        self.model = self.c.get("/v1/models").json()["data"][0]["id"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def submit(self, bodies):
        data = "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": b}) + "\n"
                       for i, b in enumerate(bodies))
        f = self.c.post("/v1/files", data={"purpose": "batch"}, files={"file": ("bench.jsonl", data)})
        f.raise_for_status()
        t0 = time.perf_counter()
        b = self.c.post("/v1/batches", json={"input_file_id": f.json()["id"], "endpoint": "/v1/completions",
                                             "completion_window": "24h"})
        b.raise_for_status()
        return b.json()["id"], t0

    def batch(self, bid):
        return self.c.get(f"/v1/batches/{bid}").json()

    def metric(self, key):
        for line in self.c.get("/metrics").text.splitlines():
            if line.startswith(key + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


def bench_serve(base, conc, dataset=None, prompts=None, input_len=64, output_len=32):
    out = tempfile.NamedTemporaryFile(prefix="wafer-jobs-bench-", suffix=".json", delete=False).name
    args = [WAFER, "bench", "serve", "--url", base, "--concurrency", str(conc), "--temperature", "0",
            "--ignore-eos", "--no-progress", "--json", out, "--output-len", str(output_len)]
    args += ["--dataset", dataset] if dataset else ["--num-prompts", str(prompts), "--input-len", str(input_len)]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode:
        sys.exit("wafer bench serve failed:\n" + p.stderr[-3000:])
    run = json.load(open(out))["runs"][0]
    os.unlink(out)
    if run["failed"]:
        sys.exit(f"wafer bench serve: {run['failed']} requests failed")
    return run


def live_ttft(srv, args, with_batch):
    bid = None
    if with_batch:  # enough lines to outlast the live load; every free slot busy before it starts
        body = {"model": srv.model, "prompt": "Once upon a time there was a little robot who", "max_tokens": 64,
                "temperature": 0, "ignore_eos": True}
        bid, _ = srv.submit([body] * 5000)
        deadline = time.time() + 60
        while srv.metric("wafer_batch_lines_total{outcome=\"completed\"}") < 1 and time.time() < deadline:
            time.sleep(0.05)
    run = bench_serve(srv.base, args.live_concurrency, prompts=args.live_prompts, input_len=args.live_input_len,
                      output_len=args.live_output_len)
    if bid:
        done = srv.batch(bid)["request_counts"]
        srv.c.post(f"/v1/batches/{bid}/cancel")
        while srv.batch(bid)["status"] != "cancelled":
            time.sleep(0.1)
        if done["completed"] + done["failed"] >= done["total"]:
            sys.exit("the batch ended before the live load did: raise its line count")
    return run["ttft_ms"]["p95"], run["ttft_ms"]["median"]


def batch_throughput(srv, bodies):
    bid, t0 = srv.submit(bodies)
    while True:
        b = srv.batch(bid)
        rc = b["request_counts"]
        if rc["completed"] + rc["failed"] >= rc["total"]:
            t1 = time.perf_counter()
            break
        time.sleep(0.02)
    while b["status"] not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.1)
        b = srv.batch(bid)
    if b["status"] != "completed" or rc["failed"]:
        sys.exit(f"the batch did not complete cleanly: {b}")
    out = srv.c.get(f"/v1/files/{b['output_file_id']}/content").text.splitlines()
    tokens = sum(json.loads(x)["response"]["body"]["usage"]["completion_tokens"] for x in out if x)
    return tokens / (t1 - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--live-concurrency", type=int, default=2)
    ap.add_argument("--live-prompts", type=int, default=24)
    ap.add_argument("--live-input-len", type=int, default=64)
    ap.add_argument("--live-output-len", type=int, default=32)
    ap.add_argument("--batch-lines", type=int, default=64)
    ap.add_argument("--batch-max-tokens", type=int, default=64)
    ap.add_argument("--only", choices=("ttft", "throughput"), help="run one of the two measures")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra wafer serve argument (repeatable)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    print(f"cpu: {cpu_name()}, {os.cpu_count()} cores; load average at start: {loadavg()}", flush=True)
    srv = Serve(args.model, args.threads, args.max_batch_size, args.serve_arg)
    res = {"model": os.path.basename(args.model), "cpu": cpu_name(), "cores": os.cpu_count(),
           "load_start": loadavg(), "rounds": []}
    prompts = [f"Story {i}: once upon a time in a small town there lived a" for i in range(args.batch_lines)]
    ds = tempfile.NamedTemporaryFile("w", prefix="wafer-jobs-bench-", suffix=".jsonl", delete=False)
    for p in prompts:
        ds.write(json.dumps({"prompt": p, "max_tokens": args.batch_max_tokens}) + "\n")
    ds.close()
    bodies = [{"model": srv.model, "prompt": p, "max_tokens": args.batch_max_tokens, "temperature": 0,
               "ignore_eos": True} for p in prompts]
    try:
        bench_serve(srv.base, 2, prompts=4, output_len=8)  # warm up
        for r in range(args.rounds):
            rec = {}
            if args.only != "throughput":
                order = (False, True) if r % 2 == 0 else (True, False)
                for wb in order:
                    p95, p50 = live_ttft(srv, args, wb)
                    rec["ttft_p95_batch" if wb else "ttft_p95_idle"] = p95
                    rec["ttft_p50_batch" if wb else "ttft_p50_idle"] = p50
                rec["ttft_ratio"] = rec["ttft_p95_batch"] / rec["ttft_p95_idle"]
            if args.only != "ttft":
                order = ("bench", "batch") if r % 2 == 0 else ("batch", "bench")
                for what in order:
                    if what == "bench":
                        rec["bench_tok_s"] = bench_serve(srv.base, args.max_batch_size, dataset=ds.name,
                                                         output_len=args.batch_max_tokens)["output_throughput"]
                    else:
                        rec["batch_tok_s"] = batch_throughput(srv, bodies)
                rec["throughput_ratio"] = rec["batch_tok_s"] / rec["bench_tok_s"]
            rec["load"] = loadavg()
            res["rounds"].append(rec)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                                  for k, v in rec.items()), flush=True)
        pre = srv.metric('wafer_batch_lines_total{outcome="preempted"}')
        print(f"batch line preemptions (a live request took the slot, or the server handed the line back): {pre:.0f}")
    finally:
        srv.close()
        os.unlink(ds.name)
    res["load_end"] = loadavg()
    for k in ("ttft_ratio", "throughput_ratio"):
        vals = [r[k] for r in res["rounds"] if k in r]
        if vals:
            res[k + "_median"] = statistics.median(vals)
    print(f"\n{res['model']} on {res['cpu']} ({res['cores']} cores), --max-batch-size {args.max_batch_size}, "
          f"--threads {args.threads}; load average {res['load_start']} -> {res['load_end']}")
    print("| measure | A | B | ratio B/A per round | median | target |\n|---|---|---|---|---|---|")
    rr = res["rounds"]

    def col(key, fmt):
        return ", ".join(format(r[key], fmt) for r in rr)

    if "ttft_ratio_median" in res:
        print(f"| live TTFT p95 (ms), C={args.live_concurrency}: idle (A) vs batch running (B) | "
              f"{col('ttft_p95_idle', '.0f')} | {col('ttft_p95_batch', '.0f')} | {col('ttft_ratio', '.2f')} | "
              f"{res['ttft_ratio_median']:.2f}x | <= 1.25x |")
    if "throughput_ratio_median" in res:
        print(f"| output tok/s: bench serve C={args.max_batch_size} (A) vs batch (B) | "
              f"{col('bench_tok_s', '.0f')} | {col('batch_tok_s', '.0f')} | {col('throughput_ratio', '.2f')} | "
              f"{res['throughput_ratio_median']:.2f}x | >= 0.90x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
