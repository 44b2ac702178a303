#!/usr/bin/env python3
"""The latency wafer route adds, against nginx proxy_pass, on one machine (`make bench-route`; docs/route.md).

Backend: nginx itself answering a fixed OpenAI-shaped body (`return 200` for a completion; for a stream the
echo module sends the first event, flushes, waits --stream-gap-ms, then the rest), one worker. It is the
fastest honest backend at hand: a C server from Debian that answers from memory in a few microseconds, so
what is measured is the proxies, and the same backend serves all three paths.

Paths, measured back to back and interleaved (the order rotates each round):
  direct   client -> backend
  route    client -> wafer route -> backend         (one pool, kind openai, keep-alive upstream)
  nginx    client -> nginx proxy_pass -> backend    (upstream keepalive 64, HTTP/1.1, one worker)

Client: scripts/route_loadgen.c, open loop at a fixed rate over keep-alive connections, latency counted
from when each request was due (no coordinated omission). Added latency = path - direct in the same round;
the ratio route/nginx of added latency is taken per round, and medians over rounds are reported.
Then --idle connections are opened to the router and kept idle while the rate is run through it again, and
each must answer once more at the end.

Placement: on a machine with 2 or more CPUs the two proxies (the router's threads, the nginx proxy's master
and worker) are pinned to CPU 0 and the load generator and backend to the others, so both proxies are measured
in the same place (--no-pin leaves it to the scheduler; on the 2-core VM the added latency of either proxy then
moves by 0.05-0.15 ms with where a sleeping proxy happens to be woken, see docs/route.md).
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

CHUNK = ('{"id":"cmpl-b","object":"text_completion","created":1,"model":"s","choices":[{"index":0,'
         '"text":"%s","logprobs":null,"finish_reason":%s}]}')
COMPLETION = ('{"id":"cmpl-a","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
              '"text":" there was a little girl named Lily.","logprobs":null,"finish_reason":"length"}],'
              '"usage":{"prompt_tokens":5,"completion_tokens":8,"total_tokens":13}}')


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def nginx_conf(d, name, servers, echo):
    load = "load_module /usr/lib/nginx/modules/ngx_http_echo_module.so;\n" if echo else ""
    tmp = os.path.join(d, "tmp-" + name)
    os.makedirs(tmp, exist_ok=True)
    text = f"""{load}worker_processes 1;
daemon off;
pid {d}/{name}.pid;
error_log {d}/{name}-error.log warn;
worker_rlimit_nofile 20000;
events {{ worker_connections 16000; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fcgi;
  uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  keepalive_requests 10000000;
  keepalive_timeout 300s;
{servers}
}}
"""
    path = os.path.join(d, name + ".conf")
    with open(path, "w") as f:
        f.write(text)
    return path


def esc(s):
    return s.replace("\\", "\\\\").replace("'", "\\'")


def wait_http(url, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("no answer from " + url)


def proc_tree(pid):
    """pid and its children (nginx's workers), from /proc."""
    out = [pid]
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open("/proc/%s/stat" % e) as f:
                    st = f.read()
                if int(st.rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(e))
            except (OSError, ValueError, IndexError):
                pass
    return out


def cpu_s(pids):
    """CPU seconds (user + system) used so far by pids."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in pids:
        try:
            with open("/proc/%d/stat" % p) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            pass
    return total / tick


def run_load(loadgen, port, body, rate, seconds, idle=0, watch=None):
    cmd = [loadgen, "--port", str(port), "--body", body, "--rate", str(rate), "--seconds", str(seconds)]
    if idle:
        cmd += ["--idle", str(idle)]
    c0 = cpu_s(watch) if watch else 0
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    c1 = cpu_s(watch) if watch else 0
    line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "{}"
    res = json.loads(line) if line.startswith("{") else {}
    res["rc"] = out.returncode
    if watch and res.get("ok"):
        res["cpu_us_per_req"] = (c1 - c0) * 1e6 / res["ok"]
    if out.returncode:
        res["stderr"] = out.stderr.strip()[-500:]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wafer", default="build/wafer")
    ap.add_argument("--loadgen", default="build/bench/route_loadgen")
    ap.add_argument("--nginx", default=shutil.which("nginx") or "/usr/sbin/nginx")
    ap.add_argument("--rate", type=float, default=1000, help="requests/s (default 1000)")
    ap.add_argument("--seconds", type=float, default=5, help="per measurement (default 5)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stream-rate", type=float, default=0, help="requests/s for streams (default: --rate)")
    ap.add_argument("--stream-gap-ms", type=int, default=20, help="backend pause after the first event")
    ap.add_argument("--idle", type=int, default=10000, help="idle keep-alive connections held (0: skip)")
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--pin-proxies", metavar="CPUS",
                    help="CPUs (taskset list) for the router's threads and the nginx proxy's processes (default "
                         "0 when the machine has 2 or more: the proxy under test on its own core, as proxy "
                         "benchmarks are run; left to the scheduler, where a sleeping proxy wakes relative to the "
                         "client and the backend moves either proxy's added latency by 0.05-0.15 ms from run to run "
                         "on a 2-core VM)")
    ap.add_argument("--pin-others", metavar="CPUS",
                    help="CPUs for the load generator and the backend (default: all but the proxies' when those "
                         "are pinned by default): every path then crosses the same CPUs the same way")
    ap.add_argument("--no-pin", action="store_true", help="leave every process to the scheduler")
    a = ap.parse_args()
    if not os.path.exists(a.nginx):
        sys.exit("bench_route: nginx not found (make deps installs Debian's nginx)")
    if not os.path.exists("/usr/lib/nginx/modules/ngx_http_echo_module.so"):
        sys.exit("bench_route: the nginx echo module is missing (libnginx-mod-http-echo; make deps)")
    for p in (a.wafer, a.loadgen):
        if not os.access(p, os.X_OK):
            sys.exit("bench_route: %s is not built (make bench-route builds it)" % p)
    srate = a.stream_rate or a.rate
    ncpu = os.cpu_count() or 1
    if a.no_pin:
        a.pin_proxies = a.pin_others = None
    elif a.pin_proxies is None and ncpu >= 2:
        a.pin_proxies = "0"
        if a.pin_others is None:
            a.pin_others = "1-%d" % (ncpu - 1)
    if a.pin_others:
        cpus = set()
        for part in a.pin_others.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
        os.sched_setaffinity(0, cpus)  # inherited by everything started below; the proxies are re-pinned
    d = tempfile.mkdtemp(prefix="wafer-bench-route-")
    b_json, b_sse, p_json, p_sse = free_port(), free_port(), free_port(), free_port()
    first = CHUNK % ("Once", "null")
    rest = [CHUNK % (" upon", "null"), CHUNK % (" a time", '"length"')]
    models = '{"object":"list","data":[{"id":"m","object":"model"},{"id":"s","object":"model"}]}'
    backend = f"""
  server {{
    listen 127.0.0.1:{b_json} backlog=4096;
    location = /health {{ return 200 "ok"; }}
    location = /v1/models {{ default_type application/json; return 200 '{models}'; }}
    location = /v1/completions {{ default_type application/json; return 200 '{esc(COMPLETION)}'; }}
  }}
  server {{
    listen 127.0.0.1:{b_sse} backlog=4096;
    location = /health {{ return 200 "ok"; }}
    location = /v1/models {{ default_type application/json; return 200 '{models}'; }}
    location = /v1/completions {{
      default_type text/event-stream;
      echo_read_request_body;
      echo 'data: {esc(first)}';
      echo '';
      echo_flush;
      echo_sleep {a.stream_gap_ms / 1000.0};
      echo 'data: {esc(rest[0])}';
      echo '';
      echo 'data: {esc(rest[1])}';
      echo '';
      echo 'data: [DONE]';
      echo '';
    }}
  }}"""
    proxy = f"""
  upstream b_json {{ server 127.0.0.1:{b_json}; keepalive 64; }}
  upstream b_sse {{ server 127.0.0.1:{b_sse}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{p_json} backlog=4096;
    location / {{ proxy_pass http://b_json; proxy_http_version 1.1; proxy_set_header Connection ""; }}
  }}
  server {{
    listen 127.0.0.1:{p_sse} backlog=4096;
    location / {{ proxy_pass http://b_sse; proxy_http_version 1.1; proxy_set_header Connection "";
                 proxy_buffering off; }}
  }}"""
    route_yaml = os.path.join(d, "route.yaml")
    with open(route_yaml, "w") as f:
        f.write(f"""server: {{host: 127.0.0.1, port: 0, log_requests: false, max_connections: 20000}}
pools:
  - {{name: json, kind: openai, backends: [http://127.0.0.1:{b_json}]}}
  - {{name: sse, kind: openai, backends: [http://127.0.0.1:{b_sse}]}}
routes:
  - {{model: m, pool: json}}
  - {{model: s, pool: sse}}
health: {{path: /health, interval_s: 2}}
""")
    body_json = os.path.join(d, "body.json")
    body_sse = os.path.join(d, "body-stream.json")
    with open(body_json, "w") as f:
        f.write('{"model":"m","prompt":"Once upon a time","max_tokens":8,"temperature":0}')
    with open(body_sse, "w") as f:
        f.write('{"model":"s","prompt":"Once upon a time","max_tokens":8,"temperature":0,"stream":true}')

    procs = []
    logf = open(os.path.join(d, "route.log"), "w")
    try:
        for name, servers, echo in (("backend", backend, True), ("proxy", proxy, False)):
            conf = nginx_conf(d, name, servers, echo)
            procs.append(subprocess.Popen([a.nginx, "-c", conf, "-p", d, "-e", os.path.join(d, name + "-error.log")],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        route = subprocess.Popen([a.wafer, "route", "--config", route_yaml], stdout=logf, stderr=subprocess.STDOUT)
        procs.append(route)
        r_port = None
        deadline = time.time() + 15
        while time.time() < deadline and not r_port:
            with open(os.path.join(d, "route.log")) as f:
                for line in f:
                    if "listening on http://" in line:
                        r_port = int(line.split("listening on http://")[1].split()[0].rsplit(":", 1)[1])
            time.sleep(0.05)
        if not r_port:
            sys.exit("bench_route: wafer route did not start:\n" + open(os.path.join(d, "route.log")).read())
        for port in (b_json, b_sse, p_json, p_sse, r_port):
            wait_http("http://127.0.0.1:%d/health" % port)
        wait_http("http://127.0.0.1:%d/ready" % r_port)

        if a.pin_proxies:
            tids = [int(t) for t in os.listdir("/proc/%d/task" % route.pid)]
            for t in tids + proc_tree(procs[1].pid):
                subprocess.run(["taskset", "-p", "-c", a.pin_proxies, str(t)], check=True, stdout=subprocess.DEVNULL)
            print("router threads %s and nginx proxy processes %s pinned to CPU(s) %s" % (
                tids, proc_tree(procs[1].pid), a.pin_proxies))
        cpu = "unknown"
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        print("CPU: %s, %d cores; load before: %s" % (cpu, os.cpu_count(), open("/proc/loadavg").read().split()[:3]))
        print("rate %.0f req/s (streams %.0f), %.0f s per measurement, %d rounds\n" % (a.rate, srate, a.seconds, a.rounds))
        targets = {"direct": (b_json, b_sse), "route": (r_port, r_port), "nginx": (p_json, p_sse)}
        # whose CPU time each path adds: the router's process, the nginx proxy's master and worker
        watch = {"direct": None, "route": [route.pid], "nginx": proc_tree(procs[1].pid)}
        # warm-up: connections, caches
        for t, (pj, ps) in targets.items():
            run_load(a.loadgen, pj, body_json, min(a.rate, 500), 1)
            run_load(a.loadgen, ps, body_sse, min(srate, 200), 1)
        results = []
        order = ["direct", "route", "nginx"]
        for rnd in range(a.rounds):
            row = {"round": rnd + 1}
            for t in order[rnd % 3:] + order[:rnd % 3]:
                row[t] = run_load(a.loadgen, targets[t][0], body_json, a.rate, a.seconds, watch=watch[t])
                row[t + "_stream"] = run_load(a.loadgen, targets[t][1], body_sse, srate, a.seconds, watch=watch[t])
            row["load"] = open("/proc/loadavg").read().split()[0]
            results.append(row)

        def f(x):
            return "%.3f" % x

        print("non-streamed, end-to-end latency (ms) at %.0f req/s; added = path - direct in the same round" % a.rate)
        print("| round | direct p50 | route p50 | nginx p50 | direct p99 | route p99 | nginx p99 | route +p50 | nginx +p50 "
              "| route +p99 | nginx +p99 | achieved req/s (d/r/n) | errors | load |")
        print("|---" * 14 + "|")
        ratios50, ratios99, add = [], [], {"r50": [], "n50": [], "r99": [], "n99": []}
        for row in results:
            d_, r_, n_ = row["direct"], row["route"], row["nginx"]
            r50, n50 = r_["p50_ms"] - d_["p50_ms"], n_["p50_ms"] - d_["p50_ms"]
            r99, n99 = r_["p99_ms"] - d_["p99_ms"], n_["p99_ms"] - d_["p99_ms"]
            add["r50"].append(r50)
            add["n50"].append(n50)
            add["r99"].append(r99)
            add["n99"].append(n99)
            if n50 > 0:
                ratios50.append(r50 / n50)
            if n99 > 0:
                ratios99.append(r99 / n99)
            print("| %d | %s | %s | %s | %s | %s | %s | %+.3f | %+.3f | %+.3f | %+.3f | %.0f/%.0f/%.0f | %d/%d/%d | %s |" % (
                row["round"], f(d_["p50_ms"]), f(r_["p50_ms"]), f(n_["p50_ms"]), f(d_["p99_ms"]), f(r_["p99_ms"]),
                f(n_["p99_ms"]), r50, n50, r99, n99, d_["rate"], r_["rate"], n_["rate"], d_["errors"], r_["errors"],
                n_["errors"], row["load"]))
        med = statistics.median
        print("\nmedian added latency: route p50 %+.3f ms, p99 %+.3f ms; nginx p50 %+.3f ms, p99 %+.3f ms" % (
            med(add["r50"]), med(add["r99"]), med(add["n50"]), med(add["n99"])))
        if ratios50:
            print("median ratio of added latency route/nginx: p50 %.2fx%s" % (
                med(ratios50), ", p99 %.2fx" % med(ratios99) if ratios99 else ""))

        cr = [row["route"].get("cpu_us_per_req", 0) for row in results]
        cn = [row["nginx"].get("cpu_us_per_req", 0) for row in results]
        crs = [row["route_stream"].get("cpu_us_per_req", 0) for row in results]
        cns = [row["nginx_stream"].get("cpu_us_per_req", 0) for row in results]
        print("\nCPU time per request of the proxy process (user + system, microseconds; independent of the "
              "machine's other load): route %s, nginx %s (medians %.1f vs %.1f, ratio %.2fx); streams: route %s, "
              "nginx %s (medians %.1f vs %.1f)" % (
                  "/".join("%.1f" % x for x in cr), "/".join("%.1f" % x for x in cn), med(cr), med(cn),
                  med(cr) / med(cn) if med(cn) else 0, "/".join("%.1f" % x for x in crs),
                  "/".join("%.1f" % x for x in cns), med(crs), med(cns)))
        print("\nstreams: first byte (first event) and end (ms) at %.0f req/s, backend pause %d ms after the first event"
              % (srate, a.stream_gap_ms))
        print("| round | direct first p50 | route first p50 | nginx first p50 | direct first p99 | route first p99 | "
              "nginx first p99 | route end p50 | errors |")
        print("|---" * 9 + "|")
        sf = {"r": [], "n": []}
        for row in results:
            d_, r_, n_ = row["direct_stream"], row["route_stream"], row["nginx_stream"]
            sf["r"].append(r_["ttfb_p50_ms"] - d_["ttfb_p50_ms"])
            sf["n"].append(n_["ttfb_p50_ms"] - d_["ttfb_p50_ms"])
            print("| %d | %s | %s | %s | %s | %s | %s | %s | %d/%d/%d |" % (
                row["round"], f(d_["ttfb_p50_ms"]), f(r_["ttfb_p50_ms"]), f(n_["ttfb_p50_ms"]), f(d_["ttfb_p99_ms"]),
                f(r_["ttfb_p99_ms"]), f(n_["ttfb_p99_ms"]), f(r_["p50_ms"]), d_["errors"], r_["errors"], n_["errors"]))
        print("\nmedian first-byte added: route %+.3f ms, nginx %+.3f ms" % (med(sf["r"]), med(sf["n"])))

        idle = None
        if a.idle:
            rss0 = int(open("/proc/%d/status" % route.pid).read().split("VmRSS:")[1].split()[0])
            idle = run_load(a.loadgen, r_port, body_json, a.rate, a.seconds, idle=a.idle)
            rss1 = int(open("/proc/%d/status" % route.pid).read().split("VmRSS:")[1].split()[0])
            direct = run_load(a.loadgen, b_json, body_json, a.rate, a.seconds)
            print("\n%d idle keep-alive connections held by the router while %.0f req/s go through it: "
                  "%d/%d answered once before, %d/%d again after; p50 %.3f ms, p99 %.3f ms (direct right after: "
                  "p50 %.3f, p99 %.3f); router RSS %d -> %d MB; errors %d" % (
                      a.idle, a.rate, idle.get("idle_first_ok", 0), a.idle, idle.get("idle_ok", 0), a.idle,
                      idle.get("p50_ms", -1), idle.get("p99_ms", -1), direct.get("p50_ms", -1),
                      direct.get("p99_ms", -1), rss0 // 1024, rss1 // 1024, idle.get("errors", -1)))
            idle["direct_after"] = direct
        print("load after: %s" % open("/proc/loadavg").read().split()[:3])
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"rate": a.rate, "stream_rate": srate, "seconds": a.seconds, "cpu": cpu, "rounds": results,
                           "idle": idle}, f, indent=1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        logf.close()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
