#!/usr/bin/env python3
"""Runs `wafer bench` and llama.cpp's `llama-bench` back to back on the same GGUF files and prints a markdown
table (the one in docs/performance.md).

The machine is shared and its speed drifts by 10% or more between minutes, so each round runs wafer and then
every llama-bench build on one model before moving on, rounds repeat the whole set, and the table reports
for each program its best round (the one least disturbed by other work: a busy neighbour costs llama.cpp,
whose threads spin, far more than wafer) and, as the ratios, the median over rounds of each round's
wafer/llama.cpp ratio (the two runs of a round are seconds apart, so they saw the same machine), followed by
the range of those ratios when there are several rounds. -d D
measures both after D tokens in the cache (llama-bench -d; where a llama-bench has no -d, as c392e50, decode at
depth comes from the llama-batched-bench beside it, as docs/performance.md measured it, and pp at depth is
not measured for it). The CPU's model name heads the table. wafer's bench measures the read bandwidth
in the same run; a round's generation GB/s is set against the bandwidth wafer measured in that round: the
probe before loading ("tg % bw") and the probes beside each tg repetition ("tg % bw beside"); llama.cpp's
against wafer's probes beside, the nearest in time (seconds before its run).

usage: scripts/bench_vs_llama.py [--wafer build/wafer] [--llama NAME=PATH/llama-bench ...] [-t 2] [-p 512]
                                 [-n 128] [-d 0] [-r 3] [--rounds 2] [--batch 8] [--json out.json] MODEL.gguf ...
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run_wafer(args, model):
    cmd = [args.wafer, "bench", "--model", model, "-p", str(args.p), "-n", str(args.n), "-r", str(args.r),
           "-t", str(args.t), "--json"]
    if args.d:
        cmd += ["-d", str(args.d)]
    if args.batch > 1:
        cmd += ["--batch", str(args.batch)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1]), " ".join(cmd)


_HAS_DEPTH = {}


def llama_has_depth(path):
    """Whether this llama-bench takes -d (--n-depth; llama.cpp builds from mid-2025 on; c392e50 has not)."""
    if path not in _HAS_DEPTH:
        h = subprocess.run([path, "--help"], capture_output=True, text=True)
        _HAS_DEPTH[path] = "n-depth" in h.stdout + h.stderr
    return _HAS_DEPTH[path]


def run_llama_batched(path, args, model):
    """Decode at depth where llama-bench has no -d: llama-batched-bench (beside it) prefills args.d tokens, then
    decodes args.n, one sequence; its speed_tg is the decode after the depth (how docs/performance.md measured
    it since stop 27). Prompt processing at a depth has no equivalent there: None."""
    bb = os.path.join(os.path.dirname(path), "llama-batched-bench")
    if not os.access(bb, os.X_OK):
        sys.exit(f"bench_vs_llama: {path} has no -d (depth) and there is no {bb} to measure decode at depth "
                 "with: build the llama-batched-bench target too, or use a llama.cpp whose llama-bench has -d")
    if args.p:
        print(f"note: {path} has no -d: pp{args.p} at depth {args.d} is not measured for it (llama-batched-bench "
              "measures decode at depth only); use -p 0", file=sys.stderr)
    res = {"pp_tps": None, "tg_tps": None}
    if not args.n:
        return res, None
    cmd = [bb, "-m", model, "-c", str(args.d + args.n), "-b", "2048", "-ub", "512", "-npp", str(args.d),
           "-ntg", str(args.n), "-npl", "1", "-t", str(args.t), "--output-format", "jsonl"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        if line.startswith("{") and '"speed_tg"' in line:
            res["tg_tps"] = json.loads(line)["speed_tg"]
    if res["tg_tps"] is None:
        sys.exit(f"bench_vs_llama: no speed_tg in the output of {' '.join(cmd)}")
    return res, " ".join(cmd)


def run_llama(path, args, model):
    if args.d and not llama_has_depth(path):
        return run_llama_batched(path, args, model)
    cmd = [path, "-m", model, "-p", str(args.p), "-n", str(args.n), "-r", str(args.r), "-t", str(args.t), "-o", "json"]
    if args.d:
        cmd += ["-d", str(args.d)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    res = {"pp_tps": None, "tg_tps": None}
    for e in json.loads(out.stdout):
        if e["n_prompt"] > 0 and e["n_gen"] == 0:
            res["pp_tps"] = e["avg_ts"]
        elif e["n_gen"] > 0 and e["n_prompt"] == 0:
            res["tg_tps"] = e["avg_ts"]
    return res, " ".join(cmd)


def best(xs):
    xs = [x for x in xs if x is not None]
    return max(xs) if xs else None


def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def pct_of(x):
    return "-" if x is None else f"{x:.0f}%"


def ratio_cell(rs):
    """The median of the per-round ratios, with their range when there are several rounds: on a machine whose
    bandwidth swings, the range says how far one round's figure can be trusted."""
    if not rs:
        return "-"
    med = f"{statistics.median(rs):.2f}x"
    return med if len(rs) == 1 else f"{med} ({min(rs):.2f}-{max(rs):.2f}x)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--wafer", default=os.path.join(os.path.dirname(__file__), "..", "build", "wafer"))
    ap.add_argument("--llama", action="append", default=[], help="NAME=path to llama-bench (repeatable)")
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-d", type=int, default=0, help="depth: tokens already in the cache (llama-bench -d)")
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--json", help="also write every raw result here")
    args = ap.parse_args()
    llamas = [tuple(s.split("=", 1)) for s in args.llama]
    raw = {}
    commands = set()
    for rnd in range(args.rounds):
        for m in args.models:
            name = os.path.basename(m)
            w, c = run_wafer(args, m)
            commands.add(c.replace(m, "MODEL"))
            raw.setdefault(name, {}).setdefault("wafer", []).append(w)
            print(f"round {rnd + 1} {name} wafer: pp {fmt(w['pp_tps'])} tg {fmt(w['tg_tps'], 2)} "
                  f"({fmt(w['tg_roofline_pct'], 0)}% of {fmt(w['membw_gbs'])} GB/s before loading, "
                  f"{fmt(w.get('tg_beside_pct'), 0)}% of {fmt(w.get('membw_beside_gbs'))} GB/s beside; "
                  f"core round trip {fmt(w.get('core_round_trip_ns_before'), 0)} / "
                  f"{fmt(w.get('core_round_trip_ns_after'), 0)} ns before / after) "
                  f"batch {fmt(w['batch_tps'])}",
                  file=sys.stderr)
            for ln, lp in llamas:
                r, c = run_llama(lp, args, m)
                if c:
                    commands.add(c.replace(m, "MODEL"))
                r["membw_gbs"] = w.get("membw_beside_gbs") or w["membw_gbs"]
                raw[name].setdefault(ln, []).append(r)
                print(f"round {rnd + 1} {name} {ln}: pp {fmt(r['pp_tps'])} tg {fmt(r['tg_tps'], 2)}", file=sys.stderr)
    hdr = ["model", "weights MB/token", "read GB/s (median)", "wafer pp", "wafer tg", "wafer tg % bw",
           "wafer tg % bw beside", f"wafer x{args.batch} tok/s",
           "batch gain", "peak RSS MiB (limit)", "load ms"]
    for ln, _ in llamas:
        hdr += [f"{ln} pp", f"{ln} tg", f"{ln} tg % bw", f"pp wafer/{ln}", f"tg wafer/{ln}"]
    first = next(iter(raw.values()))["wafer"][0]
    print(f"CPU: {first.get('cpu', 'unknown CPU')} ({first.get('cpu_flags', '')}), {args.t} threads"
          + (f", depth {args.d}" if args.d else ""))
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for m in args.models:
        name = os.path.basename(m)
        ws = raw[name]["wafer"]
        wgb = ws[0]["weight_bytes"] / 1e9
        bw = statistics.median([w["membw_gbs"] for w in ws])
        pp, tg, bt = best([w["pp_tps"] for w in ws]), best([w["tg_tps"] for w in ws]), best([w["batch_tps"] for w in ws])
        pct = best([w["tg_roofline_pct"] for w in ws])
        # the share of the probes taken just before and after each tg repetition (wafer bench >= stop 16)
        bpct = best([w.get("tg_beside_pct") for w in ws])
        # the RSS target: model file + KV cache + 100 MiB
        rss = max(w["peak_rss_bytes"] for w in ws) / 2**20
        limit = (ws[0]["model_bytes"] + ws[0]["kv_bytes"]) / 2**20 + 100
        load = statistics.median([w["load_ms"] for w in ws])
        row = [name, f"{wgb * 1e3:.1f}", fmt(bw), fmt(pp), fmt(tg, 2), pct_of(pct), pct_of(bpct), fmt(bt),
               "-" if not bt or not tg else f"{bt / tg:.2f}x", f"{rss:.0f} ({limit:.0f})", f"{load:.0f}"]
        for ln, _ in llamas:
            ls = raw[name][ln]
            lpp, ltg = best([r["pp_tps"] for r in ls]), best([r["tg_tps"] for r in ls])
            lpct = best([100 * r["tg_tps"] * wgb / r["membw_gbs"] for r in ls if r["tg_tps"] and r["membw_gbs"]])
            rpp = [w["pp_tps"] / r["pp_tps"] for w, r in zip(ws, ls) if w["pp_tps"] and r["pp_tps"]]
            rtg = [w["tg_tps"] / r["tg_tps"] for w, r in zip(ws, ls) if w["tg_tps"] and r["tg_tps"]]
            row += [fmt(lpp), fmt(ltg, 2), pct_of(lpct), ratio_cell(rpp), ratio_cell(rtg)]
        print("| " + " | ".join(row) + " |")
    print("\ncommands (MODEL = each file above):")
    for c in sorted(commands):
        print("    " + c)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
