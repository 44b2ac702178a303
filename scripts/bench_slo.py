#!/usr/bin/python3
"""bench_slo: goodput of `wafer serve` with the batch size driven by a latency SLO (max_batch_size: auto)
against fixed batch sizes, under a load that overloads the largest fixed one.

For each round, and in each round each setup in a rotated order (the machine is shared and noisy: every
setup is compared with the others of its own round, and the report gives the median of those ratios):

  auto   --max-batch-size auto --slo-itl-p95-ms ITL --slo-ttft-p95-ms TTFT (the controller picks the batch
         limit and the prefill chunk, from 32 sequences of slots)
  32     --max-batch-size 32 (no controller)
  4      --max-batch-size 4 (no controller)

it starts `wafer serve` on MODEL, sends a warm-up of --warmup requests (so the controller has settled, as a
server that has been up for a while has), then measures with `wafer bench serve --concurrency C
--num-prompts N --slo ITL,TTFT`: goodput is the requests (and their output tokens) per second that met
both objectives, each judged on its own inter-token gaps' p95 and its TTFT. The targets (issue 12): auto
holds the SLO (its ITL p95 over all gaps within ITL) and its goodput is >= 1.3x fixed 32's and >= fixed 4's.

Usage: bench_slo.py MODEL [--itl MS] [--ttft MS] [--concurrency C] [--num-prompts N] [--warmup N]
[--input-len N] [--output-len N] [--rounds R] [--threads T] [--json FILE]
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


def start_server(model, threads, extra, data_dir):
    log = tempfile.NamedTemporaryFile(prefix="wafer-slo-bench-", suffix=".log", delete=False)
    args = [WAFER, "serve", "--model", model, "--port", "0", "--threads", str(threads), "--data-dir", data_dir]
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
    sys.exit("wafer serve did not become ready:\n" + open(log.name, errors="replace").read())


def gauge(base, name):
    text = httpx.get(base + "/metrics", timeout=5).text
    m = re.search(r"^" + name + r" ([0-9.e+-]+|NaN)$", text, re.M)
    return float(m.group(1)) if m else None


def bench(base, a, n, slo, out_json):
    cmd = [WAFER, "bench", "serve", "--url", base, "--concurrency", str(a.concurrency), "--num-prompts", str(n),
           "--input-len", str(a.input_len), "--output-len", str(a.output_len), "--ignore-eos", "--no-progress",
           "--seed", "1"]
    if slo:
        cmd += ["--slo", f"{a.itl:g},{a.ttft:g}", "--json", out_json]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("wafer bench serve failed:\n" + r.stdout + r.stderr)
    return json.load(open(out_json))["runs"][0] if slo else None


def run_setup(name, a, tmp):
    extra = {"auto": ["--max-batch-size", "auto", "--slo-itl-p95-ms", f"{a.itl:g}", "--slo-ttft-p95-ms",
                      f"{a.ttft:g}", "--slo-max-batch-size", "32", "--slo-window", f"{a.window:g}"],
             "32": ["--max-batch-size", "32"], "4": ["--max-batch-size", "4"]}[name]
    proc, base, log = start_server(a.model, a.threads, extra, os.path.join(tmp, "jobs-" + name))
    try:
        if a.warmup:
            bench(base, a, a.warmup, False, None)
        out = os.path.join(tmp, f"{name}.json")
        run = bench(base, a, a.num_prompts, True, out)
        limit, chunk = gauge(base, "wafer_batch_limit"), gauge(base, "wafer_prefill_chunk")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    changes = len(re.findall(r"slo: (batch limit|prefill chunk)", open(log, errors="replace").read()))
    return {"log": log,"setup": name, "goodput_rps": run["goodput"]["request_goodput"],
            "goodput_tps": run["goodput"]["output_goodput"], "good": run["goodput"]["good"],
            "completed": run["completed"], "throughput_tps": run["output_throughput"],
            "itl_p95_ms": run["itl_ms"]["p95"], "itl_p50_ms": run["itl_ms"]["p50"],
            "ttft_p95_ms": run["ttft_ms"]["p95"], "batch_limit": limit, "prefill_chunk": chunk,
            "controller_changes": changes}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--itl", type=float, default=40, help="ITL p95 target, ms (default 40)")
    ap.add_argument("--ttft", type=float, default=3000, help="TTFT p95 target, ms (default 3000)")
    ap.add_argument("--window", type=float, default=5, help="the controller's window, s (default 5)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--num-prompts", type=int, default=192)
    ap.add_argument("--warmup", type=int, default=96)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write every run and the summary here")
    a = ap.parse_args()
    setups = ["auto", "32", "4"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="wafer-slo-bench-") as tmp:
        for r in range(a.rounds):
            order = setups[r % 3:] + setups[:r % 3]
            for name in order:
                row = run_setup(name, a, tmp)
                row["round"] = r
                rows.append(row)
                print(f"round {r} {name:>4}: goodput {row['goodput_rps']:.2f} req/s {row['goodput_tps']:.0f} tok/s "
                      f"({row['good']}/{row['completed']} met), throughput {row['throughput_tps']:.0f} tok/s, "
                      f"ITL p50/p95 {row['itl_p50_ms']:.1f}/{row['itl_p95_ms']:.1f} ms, TTFT p95 "
                      f"{row['ttft_p95_ms']:.0f} ms, limit {row['batch_limit']:g}, chunk {row['prefill_chunk']:g}, "
                      f"{row['controller_changes']} controller changes", flush=True)

    def ratio(x, y, key):
        return [(p[key] / q[key]) if q[key] > 0 else float("inf") for p, q in zip(x, y)]

    by = {s: [row for row in rows if row["setup"] == s] for s in setups}
    summary = {}
    for key in ("goodput_rps", "goodput_tps"):
        summary[key + "_auto_over_32"] = statistics.median(ratio(by["auto"], by["32"], key))
        summary[key + "_auto_over_4"] = statistics.median(ratio(by["auto"], by["4"], key))
    summary["auto_itl_p95_ms"] = statistics.median(row["itl_p95_ms"] for row in by["auto"])
    summary["auto_ttft_p95_ms"] = statistics.median(row["ttft_p95_ms"] for row in by["auto"])
    summary["held_slo"] = summary["auto_itl_p95_ms"] <= a.itl and summary["auto_ttft_p95_ms"] <= a.ttft
    summary["target_vs_32"] = summary["goodput_rps_auto_over_32"] >= 1.3
    summary["target_vs_4"] = summary["goodput_rps_auto_over_4"] >= 1.0
    print(f"\nmedians over {a.rounds} round(s): auto / fixed 32 goodput {summary['goodput_rps_auto_over_32']:.2f}x "
          f"(req/s), {summary['goodput_tps_auto_over_32']:.2f}x (tok/s); auto / fixed 4 "
          f"{summary['goodput_rps_auto_over_4']:.2f}x (req/s), {summary['goodput_tps_auto_over_4']:.2f}x (tok/s); "
          f"auto ITL p95 {summary['auto_itl_p95_ms']:.1f} ms (target {a.itl:g}), TTFT p95 "
          f"{summary['auto_ttft_p95_ms']:.0f} ms (target {a.ttft:g})")
    print("targets: auto holds the SLO: %s; >= 1.3x fixed 32: %s; >= fixed 4: %s" % (
        "yes" if summary["held_slo"] else "NO", "yes" if summary["target_vs_32"] else "NO",
        "yes" if summary["target_vs_4"] else "NO"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "runs": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
