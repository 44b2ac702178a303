"""End-to-end tests of `wafer bench serve` and `wafer bench compare` against stand-in servers on loopback.

The stand-in (standin_server.py) streams with known delays, so the latencies wafer reports can be checked
against what the server did, and it misbehaves on request (HTTP 500, cut streams, bad JSON, stalls) so the
error accounting can be checked too. The HTML report is opened in headless Chromium.
"""

import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest

from standin_server import ClosingServer, StandinServer

REPO = Path(__file__).resolve().parents[2]
WAFER = os.environ.get("WAFER_BIN") or str(REPO / "build" / "wafer")
ARTIFACTS = REPO / "build" / "artifacts"
CHROMIUM = "/usr/bin/chromium"

pytestmark = pytest.mark.skipif(not os.path.exists(WAFER), reason="wafer binary not built (run make): " + WAFER)


def run_wafer(*args, timeout=40):
    return subprocess.run([WAFER, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def bench(tmp_path, url, *args, name="out", timeout=40, expect_rc=0):
    """Runs `wafer bench serve` with --json and returns (process, parsed json)."""
    out = tmp_path / (name + ".json")
    p = run_wafer("bench", "serve", "--url", url, "--json", out, "--no-calibrate", *args, timeout=timeout)
    assert p.returncode == expect_rc, "rc %d\nstdout:\n%s\nstderr:\n%s" % (p.returncode, p.stdout, p.stderr)
    for bad in ("Traceback", "Assertion", "Sanitizer", "runtime error:"):  # also when WAFER_BIN is an ASan build
        assert bad not in p.stderr, p.stderr
    return p, json.loads(out.read_text())


def percentile(values, p):
    """numpy.percentile's default (linear) on a list."""
    v = sorted(values)
    rank = p / 100 * (len(v) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def check_counts(run):
    assert run["completed"] + run["failed"] == run["sent"]
    assert sum(run["errors"].values()) == run["failed"]
    assert sum(run["http_status"].values()) == run["errors"]["http"]


# ---------------------------------------------------------------------------------------------------------
def test_help_and_dispatch():
    p = run_wafer("--help")
    assert p.returncode == 0 and "bench" in p.stdout
    p = run_wafer("bench", "--help")
    assert p.returncode == 0
    for tool in ("bench serve", "bench compare", "bench --model"):
        assert tool in p.stdout
    p = run_wafer("bench", "serve", "--help")
    assert p.returncode == 0 and "--concurrency" in p.stdout and "--request-rate" in p.stdout
    p = run_wafer("bench", "compare", "--help")
    assert p.returncode == 0 and "A.json B.json" in p.stdout
    p = run_wafer("bench", "--model", "m.gguf", "--no-membw")  # the engine benchmark (test_bench_model.py)
    assert p.returncode == 1 and "m.gguf" in p.stderr


@pytest.mark.parametrize("args,message", [
    ([], "--url is required"),
    (["--url", "127.0.0.1:1"], "must start with http://"),
    (["--url", "http://127.0.0.1:1", "--concurrency", "0"], "--concurrency"),
    (["--url", "http://127.0.0.1:1", "--concurrency", "1,,2"], "bad list"),
    (["--url", "http://127.0.0.1:1", "--concurrency", "2", "--request-rate", "3"], "not both"),
    (["--url", "http://127.0.0.1:1", "--request-rate", "-1"], "--request-rate"),
    (["--url", "http://127.0.0.1:1", "--slo", "ttft=fast"], "--slo"),
    (["--url", "http://127.0.0.1:1", "--endpoint", "embeddings"], "--endpoint"),
    (["--url", "http://127.0.0.1:1", "--timeout", "0"], "--timeout"),
    (["--url", "http://127.0.0.1:1", "--num-prompts"], "needs a value"),
    (["--url", "http://127.0.0.1:1", "--frobnicate"], "unknown option"),
    (["--url", "http://127.0.0.1:1", "--dataset", "/nonexistent/d.jsonl"], "cannot open"),
    (["--url", "http://127.0.0.1:1", "--turns", "0"], "--turns must be"),
    (["--url", "http://127.0.0.1:1", "--turns", "2", "--request-rate", "3"], "--request-rate does not apply"),
    (["--url", "http://127.0.0.1:1", "--turns", "1000", "--num-prompts", "20000"], "over 10,000,000 requests"),
])
def test_bad_arguments(args, message):
    p = run_wafer("bench", "serve", *args)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr


def test_dataset_too_short_for_a_conversation(tmp_path):
    ds = tmp_path / "d.jsonl"
    ds.write_text('{"prompt": "only one"}\n')
    p = run_wafer("bench", "serve", "--url", "http://127.0.0.1:1", "--dataset", ds, "--turns", 2)
    assert p.returncode == 2 and "a conversation of --turns 2 needs 2" in p.stderr, p.stderr


def test_bad_dataset_line_is_named(tmp_path):
    ds = tmp_path / "d.jsonl"
    ds.write_text('{"prompt": "fine", "max_tokens": 4}\n{"prompt": 12}\n')
    with StandinServer() as srv:
        p = run_wafer("bench", "serve", "--url", srv.url, "--dataset", ds)
        assert p.returncode == 2
        assert "d.jsonl:2:" in p.stderr and '"prompt" must be a non-empty string' in p.stderr
        assert not srv.records  # checked before any request


def test_counts_tokens_and_usage(tmp_path):
    with StandinServer(ttft_ms=5, itl_ms=1) as srv:
        p, res = bench(tmp_path, srv.url, "--num-prompts", 24, "--concurrency", "1,4", "--input-len", 16,
                       "--output-len", 8)
        records = list(srv.records)
    assert res["model"] == "standin-model"  # from GET /v1/models
    assert len(res["runs"]) == 2 and len(records) == 48
    for i, run in enumerate(res["runs"]):
        check_counts(run)
        assert run["sent"] == 24 and run["completed"] == 24 and run["failed"] == 0
        recs = records[24 * i:24 * (i + 1)]  # runs are sequential
        assert run["total_output_tokens"] == sum(r["completion_tokens"] for r in recs) == 24 * 8
        assert run["total_input_tokens"] == sum(r["prompt_tokens"] for r in recs) == 24 * 16
        assert run["output_tokens_from_usage"] == 24 and run["input_tokens_from_usage"] == 24
        assert run["itl_ms"]["n"] == 24 * 7 and run["tpot_ms"]["n"] == 24 and run["ttft_ms"]["n"] == 24
        assert abs(run["output_throughput"] - run["total_output_tokens"] / run["duration_s"]) < 1e-6
        assert abs(run["request_throughput"] - 24 / run["duration_s"]) < 1e-9
    assert res["runs"][0]["concurrency"] == 1 and res["runs"][1]["concurrency"] == 4
    # every request asked for a stream with usage, and prompts were 16 words
    body = records[0]["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 8 and body["model"] == "standin-model"
    assert records[0]["auth"] is None and "ignore_eos" not in body and "temperature" not in body
    assert all(len(r["prompt"].split()) == 16 for r in records)
    assert "run 2/2: concurrency 4" in p.stdout and "summary" in p.stdout


def test_usage_preferred_over_chunk_count_and_fallback(tmp_path):
    with StandinServer(ttft_ms=2, itl_ms=1) as srv:
        # two tokens per chunk: usage (16 per request) differs from the 8 chunks seen
        _, res = bench(tmp_path, srv.url + "/double", "--num-prompts", 5, "--concurrency", 5, "--output-len", 16,
                       "--input-len", 10, name="double")
        run = res["runs"][0]
        assert run["total_output_tokens"] == sum(r["completion_tokens"] for r in srv.records) == 5 * 16
        assert run["itl_ms"]["n"] == 5 * 7  # gaps between the 8 chunks
        # no usage at all: output tokens are the chunks, input tokens the synthetic length
        _, res = bench(tmp_path, srv.url + "/nousage", "--num-prompts", 5, "--concurrency", 5, "--output-len", 6,
                       "--input-len", 10, name="nousage")
        run = res["runs"][0]
        assert run["completed"] == 5
        assert run["total_output_tokens"] == 5 * 6 and run["output_tokens_from_usage"] == 0
        assert run["total_input_tokens"] == 5 * 10 and run["input_tokens_from_usage"] == 0


def test_latency_matches_fixed_delays(tmp_path):
    ttft, itl, n_out = 150, 25, 8
    with StandinServer(ttft_ms=ttft, itl_ms=itl) as srv:
        _, res = bench(tmp_path, srv.url, "--num-prompts", 12, "--concurrency", 4, "--output-len", n_out,
                       "--input-len", 8)
    run = res["runs"][0]
    assert run["completed"] == 12
    # the server waits ttft after reading the request, so TTFT can only be a little above it
    assert ttft - 1 <= run["ttft_ms"]["p50"] <= ttft + 15, run["ttft_ms"]
    assert ttft - 1 <= run["ttft_ms"]["median"] <= ttft + 15
    assert abs(run["itl_ms"]["median"] - itl) <= 4, run["itl_ms"]
    assert abs(run["itl_ms"]["mean"] - itl) <= 4
    assert abs(run["tpot_ms"]["p50"] - itl) <= 3, run["tpot_ms"]
    e2e = ttft + (n_out - 1) * itl
    assert e2e - 1 <= run["e2e_ms"]["p50"] <= e2e + 15, run["e2e_ms"]
    # TPOT is (E2E - TTFT) / (tokens - 1) per request: its mean lies between the extremes of that formula
    assert run["tpot_ms"]["min"] >= itl - 3 and run["tpot_ms"]["max"] <= itl + 8
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        s = run[m]
        assert s["p50"] == s["median"] and s["min"] <= s["p50"] <= s["p90"] <= s["p95"] <= s["p99"] <= s["max"]


def test_percentiles_on_known_spread(tmp_path):
    # ten requests whose TTFTs are 50, 100, ..., 500 ms: linear interpolation gives p50 275, p90 455, p95 477.5,
    # p99 495.5 (nearest-rank would give 250/300, 450/500, 500, 500)
    ttfts = [50 * (i + 1) for i in range(10)]
    delays = list(reversed(ttfts))
    ds = tmp_path / "spread.jsonl"
    ds.write_text("".join(json.dumps({"prompt": "ttft=%d itl=%d case %d" % (t, 2 + i, i), "max_tokens": 2 + i % 4})
                          + "\n" for i, t in enumerate(delays)))
    with StandinServer() as srv:
        _, res = bench(tmp_path, srv.url, "--dataset", ds, "--concurrency", 10, "--detailed")
    run = res["runs"][0]
    assert run["completed"] == 10 and run["input_len"] is None and res["config"]["dataset"] == str(ds)
    reqs = run["requests"]  # in prompt order
    assert [q["outcome"] for q in reqs] == ["completed"] * 10
    # each request's TTFT is its server-side delay plus loopback and scheduling time
    for q, want in zip(reqs, delays):
        assert want - 1 <= q["ttft_ms"] <= want + 40, (want, q["ttft_ms"])
    s = run["ttft_ms"]
    for p in (50, 90, 95, 99):
        assert percentile(ttfts, p) - 1 <= s["p%d" % p] <= percentile(ttfts, p) + 40, (p, s)
    # and the summaries are exactly numpy's linear percentiles of the per-request values
    samples = {
        "ttft_ms": [q["ttft_ms"] for q in reqs],
        "e2e_ms": [q["e2e_ms"] for q in reqs],
        "tpot_ms": [q["tpot_ms"] for q in reqs if q["output_tokens"] > 1],
        "itl_ms": [g for q in reqs for g in q["itl_ms"]],
    }
    assert len(samples["itl_ms"]) == sum(q["output_tokens"] - 1 for q in reqs)
    for q in reqs:
        assert abs(q["tpot_ms"] - (q["e2e_ms"] - q["ttft_ms"]) / (q["output_tokens"] - 1)) < 1e-9
    for metric, values in samples.items():
        got = run[metric]
        assert got["n"] == len(values)
        for p in (50, 90, 95, 99):
            assert abs(got["p%d" % p] - percentile(values, p)) < 1e-6, (metric, p)
        assert abs(got["mean"] - sum(values) / len(values)) < 1e-6
        assert got["min"] == min(values) and got["max"] == max(values) and got["median"] == got["p50"]


def test_errors_are_counted_by_kind(tmp_path):
    with StandinServer(ttft_ms=5, itl_ms=2) as srv:
        # mix: request k is ok / 500 / cut / malformed / no [DONE], in turn
        p, res = bench(tmp_path, srv.url + "/mix", "--num-prompts", 20, "--concurrency", 4, "--output-len", 6,
                       "--input-len", 4, name="mix")
        run = res["runs"][0]
        check_counts(run)
        assert run["completed"] == 4 and run["failed"] == 16
        assert run["errors"] == {"connect": 0, "http": 4, "timeout": 0, "stream": 12, "other": 0}
        assert run["http_status"] == {"500": 4}
        assert "stand-in failure" in run["error_samples"]["http"]
        assert run["total_output_tokens"] == 4 * 6  # only completed requests count
        assert "HTTP 500: 4" in p.stdout

        for mode, needle in (("errorevent", "stand-in exploded"), ("malformed", "bad JSON"),
                             ("cut", "cut after 2"), ("nodone", "without data: [DONE]")):
            _, res = bench(tmp_path, srv.url + "/" + mode, "--num-prompts", 3, "--concurrency", 3,
                           "--output-len", 5, "--input-len", 4, name=mode, expect_rc=1)
            run = res["runs"][0]
            check_counts(run)
            assert run["errors"]["stream"] == 3 and run["completed"] == 0, (mode, run)
            assert needle in run["error_samples"]["stream"], (mode, run["error_samples"])

        # a stalled stream hits --timeout
        srv.stall_s = 2.0
        _, res = bench(tmp_path, srv.url + "/stall", "--num-prompts", 3, "--concurrency", 3, "--timeout", 0.4,
                       "--output-len", 4, "--input-len", 4, name="stall", expect_rc=1)
        run = res["runs"][0]
        assert run["errors"]["timeout"] == 3 and run["failed"] == 3
        assert run["e2e_ms"]["n"] == 0 and run["ttft_ms"]["mean"] is None
        # ...but a server that keeps the body open after [DONE] delivered whole answers: they complete,
        # and the stream ended at [DONE]
        srv.stall_s = 1.0
        _, res = bench(tmp_path, srv.url + "/linger", "--num-prompts", 3, "--concurrency", 3, "--timeout", 0.4,
                       "--output-len", 4, "--input-len", 4, name="linger")
        run = res["runs"][0]
        assert run["completed"] == 3 and run["e2e_ms"]["max"] < 200, run


def test_closed_port_and_no_http(tmp_path):
    port = free_port()
    p, res = bench(tmp_path, "http://127.0.0.1:%d" % port, "--num-prompts", 6, "--concurrency", "2,3",
                   "--input-len", 4, name="closed", expect_rc=1)
    assert len(res["runs"]) == 2
    for run in res["runs"]:
        check_counts(run)
        assert run["errors"]["connect"] == 6 and run["completed"] == 0
        assert run["request_throughput"] == 0 and run["ttft_ms"]["p99"] is None
    assert res["model"] is None  # /v1/models was unreachable too
    assert "no request completed" in p.stderr
    with ClosingServer() as srv:
        _, res = bench(tmp_path, srv.url, "--num-prompts", 4, "--concurrency", 2, "--input-len", 4, name="closing",
                       expect_rc=1)
    run = res["runs"][0]
    check_counts(run)
    assert run["errors"]["other"] == 4, run


def test_chat_endpoint_role_chunk_is_not_a_token(tmp_path):
    with StandinServer(ttft_ms=80, itl_ms=5) as srv:
        _, res = bench(tmp_path, srv.url, "--endpoint", "chat", "--num-prompts", 4, "--concurrency", 2,
                       "--output-len", 5, "--input-len", 6, "--model", "my-model", "--temperature", 0.5,
                       "--ignore-eos", "--api-key", "sk-test-123")
        rec = srv.records[0]
    run = res["runs"][0]
    assert res["url"].endswith("/v1/chat/completions") and res["endpoint"] == "chat"
    assert rec["chat"] and rec["body"]["messages"][0]["role"] == "user"
    assert rec["body"]["model"] == "my-model" and rec["body"]["temperature"] == 0.5
    assert rec["body"]["ignore_eos"] is True and rec["auth"] == "Bearer sk-test-123"
    assert run["completed"] == 4
    assert run["ttft_ms"]["min"] >= 79  # the empty role chunk came at once; the first token at 80 ms
    assert run["itl_ms"]["n"] == 4 * 4


def test_request_rate_and_seed(tmp_path):
    with StandinServer(ttft_ms=2, itl_ms=1) as srv:
        _, res = bench(tmp_path, srv.url, "--request-rate", "40,inf", "--num-prompts", 12, "--output-len", 3,
                       "--input-len", 12, "--seed", 7, name="rate")
        first = [r["prompt"] for r in srv.records[:12]]
        srv.records.clear()
        bench(tmp_path, srv.url, "--num-prompts", 12, "--output-len", 3, "--input-len", 12, "--seed", 7, name="again")
        again = [r["prompt"] for r in srv.records]
        srv.records.clear()
        bench(tmp_path, srv.url, "--num-prompts", 12, "--output-len", 3, "--input-len", 12, "--seed", 8, name="other")
        other = [r["prompt"] for r in srv.records]
    assert res["config"]["mode"] == "request_rate" and res["config"]["request_rate"] == [40, "inf"]
    r40, rinf = res["runs"]
    assert r40["request_rate"] == 40 and r40["concurrency"] is None and rinf["request_rate"] == "inf"
    assert r40["completed"] == 12 and rinf["completed"] == 12
    # Poisson arrivals at 40/s spread 12 requests over a few hundred ms; "inf" sends them at once
    assert r40["duration_s"] > rinf["duration_s"]
    assert sorted(first) == sorted(again)  # same seed, same prompts
    assert set(first).isdisjoint(other)


def test_fresh_prompts_per_load_point(tmp_path):
    """Each load point of a sweep sends prompts no earlier point sent (a prefix cache must not answer them);
    --reuse-prompts sends the same set at every point; a dataset is read in consecutive slices."""
    with StandinServer(ttft_ms=1, itl_ms=1) as srv:
        _, res = bench(tmp_path, srv.url, "--concurrency", "1,2,4", "--num-prompts", 6, "--output-len", 2,
                       "--input-len", 10, name="fresh")
        runs = [[r["prompt"] for r in srv.records[6 * i:6 * (i + 1)]] for i in range(3)]
        srv.records.clear()
        _, again = bench(tmp_path, srv.url, "--concurrency", "1,2,4", "--num-prompts", 6, "--output-len", 2,
                         "--input-len", 10, name="again")
        runs_again = [[r["prompt"] for r in srv.records[6 * i:6 * (i + 1)]] for i in range(3)]
        srv.records.clear()
        _, reuse = bench(tmp_path, srv.url, "--concurrency", "1,2", "--num-prompts", 6, "--output-len", 2,
                         "--input-len", 10, "--reuse-prompts", name="reuse")
        reused = [[r["prompt"] for r in srv.records[6 * i:6 * (i + 1)]] for i in range(2)]
        srv.records.clear()
        ds = tmp_path / "ds.jsonl"
        ds.write_text("".join(json.dumps({"prompt": f"line {i}", "max_tokens": 2}) + "\n" for i in range(8)))
        bench(tmp_path, srv.url, "--concurrency", "1,2", "--num-prompts", 4, "--dataset", ds, name="ds")
        ds_runs = [sorted(r["prompt"] for r in srv.records[4 * i:4 * (i + 1)]) for i in range(2)]
    assert res["config"]["reuse_prompts"] is False and reuse["config"]["reuse_prompts"] is True
    assert all(len(set(r)) == 6 for r in runs)
    for i in range(3):
        for j in range(i):
            assert set(runs[i]).isdisjoint(runs[j]), (i, j)
        assert sorted(runs[i]) == sorted(runs_again[i])  # same seed, same requests
    assert sorted(reused[0]) == sorted(reused[1])
    assert ds_runs == [[f"line {i}" for i in range(4)], [f"line {i}" for i in range(4, 8)]]


def _conversations(records, first):
    """Groups stand-in records by their conversation (the first user message), each in turn order."""
    convs = {}
    for r in records:
        convs.setdefault(first(r), []).append(r)
    return [sorted(c, key=lambda r: len(r["prompt"])) for c in convs.values()]


def test_conversations_send_history_and_count_cached_tokens(tmp_path):
    """--turns: each turn resends the conversation so far (chat: user and assistant messages; completions:
    the earlier prompts and answers verbatim), starts when the previous answer has streamed, and the report
    counts usage's cached_tokens overall and per turn."""
    with StandinServer(ttft_ms=1, itl_ms=1, prefix_cache=True) as srv:
        p, chat = bench(tmp_path, srv.url, "--endpoint", "chat", "--turns", 3, "--concurrency", 2, "--num-prompts", 4,
                        "--input-len", 6, "--output-len", 3, "--detailed", name="chat")
        chat_recs = list(srv.records)
        srv.records.clear()
        srv.sequences.clear()
        _, comp = bench(tmp_path, srv.url, "--turns", 3, "--concurrency", 2, "--num-prompts", 3, "--input-len", 6,
                        "--output-len", 3, "--detailed", name="comp")
        comp_recs = list(srv.records)
    answer = " tok0 tok1 tok2"
    assert "cached" in p.stdout and "TTFT p50" in p.stdout  # the hit rate and the per-turn table
    assert chat["config"]["turns"] == 3 and chat["config"]["num_prompts"] == 12
    convs = _conversations(chat_recs, lambda r: r["body"]["messages"][0]["content"])
    assert len(chat_recs) == 12 and len(convs) == 4
    for conv in convs:
        msgs = [r["body"]["messages"] for r in conv]
        assert [len(m) for m in msgs] == [1, 3, 5]
        for t in range(2):
            assert msgs[t + 1][:len(msgs[t])] == msgs[t]  # the history, unchanged
            assert msgs[t + 1][len(msgs[t])] == {"role": "assistant", "content": answer}  # what was streamed
        assert [m["role"] for m in msgs[2]] == ["user", "assistant", "user", "assistant", "user"]
        for r, m in zip(conv, msgs):  # everything before the new message was cached, nothing of it
            assert r["cached_tokens"] == len(" ".join(x["content"] for x in m[:-1]).split())
    assert len({m["content"] for r in chat_recs for m in r["body"]["messages"] if m["role"] == "user"}) == 12

    run = chat["runs"][0]
    check_counts(run)
    assert run["completed"] == 12 and run["cached_tokens_from_usage"] == 12
    assert run["cached_tokens"] == sum(r["cached_tokens"] for r in chat_recs) > 0
    assert run["prefix_cache_hit_rate"] == pytest.approx(run["cached_tokens"] / run["total_input_tokens"])
    assert [u["turn"] for u in run["turns"]] == [1, 2, 3]
    assert [u["sent"] for u in run["turns"]] == [4, 4, 4] and [u["completed"] for u in run["turns"]] == [4, 4, 4]
    assert run["turns"][0]["cached_tokens"] == 0 and run["turns"][0]["prefix_cache_hit_rate"] == 0
    for t in (1, 2):
        want = sum(r["cached_tokens"] for r in chat_recs if len(r["body"]["messages"]) == 2 * t + 1)
        assert run["turns"][t]["cached_tokens"] == want > 0
    means = [u["mean_input_tokens"] for u in run["turns"]]
    assert means[2] > means[1] > means[0]  # the history grows
    assert sorted(q["turn"] for q in run["requests"]) == [1] * 4 + [2] * 4 + [3] * 4
    assert sum(q["cached_tokens"] for q in run["requests"]) == run["cached_tokens"]

    convs = _conversations(comp_recs, lambda r: r["prompt"][:20])
    assert len(comp_recs) == 9 and len(convs) == 3
    for conv in convs:
        for t in range(2):
            prev, cur = conv[t]["prompt"], conv[t + 1]["prompt"]
            assert cur.startswith(prev + answer + "\n\n") and len(cur) > len(prev + answer) + 2
            assert conv[t + 1]["cached_tokens"] == len((prev + answer).split())
    assert comp["runs"][0]["turns"][2]["cached_tokens"] > comp["runs"][0]["turns"][1]["cached_tokens"] > 0


def test_conversations_against_wafer_serve(tmp_path, make_server):
    """A real server: later turns find the history in wafer serve's prefix cache, and the cached tokens the
    report adds up from usage are the ones the server's /metrics counted."""
    from conftest import STORIES
    # three turns outgrow stories260K's 128-token training context; the cache, not the text, is under test
    s = make_server(STORIES, "--chat-template", "chatml", "--max-batch-size", "4", "--ctx-size", "512")
    before = s.metrics().get("wafer_prefix_cache_hit_tokens_total", 0)
    _, res = bench(tmp_path, s.base, "--endpoint", "chat", "--turns", 3, "--concurrency", 2, "--num-prompts", 4,
                   "--input-len", 8, "--output-len", 8, "--ignore-eos", name="real", timeout=120)
    run = res["runs"][0]
    check_counts(run)
    assert run["completed"] == 12 and run["cached_tokens_from_usage"] == 12
    assert run["cached_tokens"] == s.metrics()["wafer_prefix_cache_hit_tokens_total"] - before
    first, later = run["turns"][0], run["turns"][1:]
    for u in later:
        assert u["prefix_cache_hit_rate"] > 0.3 and u["prefix_cache_hit_rate"] > first["prefix_cache_hit_rate"]
        assert u["mean_input_tokens"] > first["mean_input_tokens"]


def test_conversation_stops_at_a_failed_turn(tmp_path):
    """A failed turn ends its conversation: the turns after it are counted as failed, not sent. The stand-in's
    mix mode answers request k as ok, 500, cut, malformed, no [DONE] (k mod 5); one conversation at a time."""
    with StandinServer(ttft_ms=1, itl_ms=1) as srv:
        _, res = bench(tmp_path, srv.url + "/mix", "--turns", 2, "--concurrency", 1, "--num-prompts", 5,
                       "--input-len", 4, "--output-len", 2, expect_rc=0)
        modes = [r["mode"] for r in srv.records]
    # conversations: (ok, 500), (cut), (malformed), (nodone), (ok, 500)
    assert modes == ["ok", "status500", "cut", "malformed", "nodone", "ok", "status500"]
    run = res["runs"][0]
    check_counts(run)
    assert run["sent"] == 10 and run["completed"] == 2
    assert run["errors"] == {"connect": 0, "http": 2, "timeout": 0, "stream": 3, "other": 3}
    assert "earlier turn" in run["error_samples"]["other"]
    assert [(u["sent"], u["completed"]) for u in run["turns"]] == [(5, 2), (5, 0)]
    assert run["cached_tokens_from_usage"] == 0 and run["prefix_cache_hit_rate"] is None


def test_long_context_and_ttft_growth(tmp_path):
    # TTFT grows 0.02 ms per prompt token on this stand-in, like prefill would
    lens = [512, 8192, 16384]
    with StandinServer(ttft_ms=5, itl_ms=1, ttft_per_token_ms=0.02) as srv:
        p, res = bench(tmp_path, srv.url, "--input-len", ",".join(map(str, lens)), "--num-prompts", 3,
                       "--concurrency", 3, "--output-len", 2, "--html", tmp_path / "long.html")
        words = [len(r["prompt"].split()) for r in srv.records]
    assert words == [512] * 3 + [8192] * 3 + [16384] * 3
    runs = res["runs"]
    assert [r["input_len"] for r in runs] == lens
    assert [r["mean_input_tokens"] for r in runs] == lens
    p50 = [r["ttft_ms"]["p50"] for r in runs]
    assert p50[0] < p50[1] < p50[2], p50
    assert p50[2] >= 5 + 0.02 * 16384 - 1
    html = (tmp_path / "long.html").read_text()
    assert 'id="chart-ttft-vs-input"' in html
    assert re.search(r"^\s+3\s+16384\s+3\s+0\s", p.stdout, re.M), p.stdout  # the sweep table row


def test_tokenize_calibration(tmp_path):
    # a server whose tokenizer makes 2 tokens of each word: a 64-token prompt becomes 32 words
    with StandinServer(ttft_ms=2, itl_ms=1, tokens_per_word=2.0, tokenize=True) as srv:
        out = tmp_path / "cal.json"
        p = run_wafer("bench", "serve", "--url", srv.url, "--input-len", 64, "--num-prompts", 2, "--output-len", 2,
                      "--json", out)
        assert p.returncode == 0, p.stderr
        res = json.loads(out.read_text())
        words = [len(r["prompt"].split()) for r in srv.records]
    assert res["config"]["calibrated"] is True and res["config"]["tokens_per_word"] == 2.0
    assert words == [32, 32]
    assert res["runs"][0]["mean_input_tokens"] == 64


def test_quality_scores(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"prompt": "What is the capital of France?", "expected_keywords": ["Paris", "France"]})
                 + "\n" + json.dumps({"prompt": "Name the first primes.", "expected_keywords": ["2", "3", "banana"],
                                      "max_tokens": 20}) + "\n")
    answers = {"capital of France": "The capital of France is paris .", "first primes": "They are 2 and 3 ."}
    with StandinServer(ttft_ms=2, itl_ms=1, answers=answers) as srv:
        p, res = bench(tmp_path, srv.url, "--quality", q, "--num-prompts", 0)
        bodies = [r["body"] for r in srv.records]
    assert res["runs"] == []
    qual = res["quality"]
    assert len(qual["cases"]) == 2
    assert qual["cases"][0]["score"] == 1.0 and qual["cases"][0]["missing"] == []
    assert abs(qual["cases"][1]["score"] - 2 / 3) < 1e-9 and qual["cases"][1]["missing"] == ["banana"]
    assert abs(qual["score"] - (1 + 2 / 3) / 2) < 1e-9
    assert "paris" in qual["cases"][0]["answer"]
    assert all(b["temperature"] == 0 for b in bodies)  # answers are greedy unless --temperature says otherwise
    assert sorted(b["max_tokens"] for b in bodies) == [20, 128]
    assert "overall score 0.833" in p.stdout
    assert re.search(r"2\s+0\.67\s+2/3", p.stdout) and 'missing: "banana"' in p.stdout


def test_cost_and_compare(tmp_path):
    with StandinServer(ttft_ms=30, itl_ms=6) as slow, StandinServer(ttft_ms=10, itl_ms=2) as fast:
        _, a = bench(tmp_path, slow.url, "--num-prompts", 8, "--concurrency", "1,4", "--output-len", 6,
                     "--input-len", 8, "--cost-per-hour", 2.0, "--label", "slow-server", name="a")
        _, b = bench(tmp_path, fast.url, "--num-prompts", 8, "--concurrency", "4,8", "--output-len", 6,
                     "--input-len", 8, "--cost-per-hour", 3.0, "--label", "fast-server",
                     "--slo", "ttft=500ms,tpot=50ms,e2e=10s", name="b")
    for res, price in ((a, 2.0), (b, 3.0)):
        for run in res["runs"]:
            c = run["cost"]
            assert c["usd_per_hour"] == price
            assert abs(c["usd_per_request"] - price / 3600 / run["request_throughput"]) < 1e-12
            assert abs(c["usd_per_million_output_tokens"] - price / 3600 / run["output_throughput"] * 1e6) < 1e-9
    g = b["runs"][0]["goodput"]
    assert g["good"] == 8 and g["slo"]["ttft_ms"] == 500 and g["slo"]["e2e_ms"] == 10000
    assert abs(g["request_goodput"] - b["runs"][0]["request_throughput"]) < 1e-9
    assert a["runs"][0]["goodput"] is None

    p = run_wafer("bench", "compare", tmp_path / "a.json", tmp_path / "b.json")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "slow-server" in out and "fast-server" in out
    assert "== concurrency 4, input 8 ==" in out
    assert "only in A: concurrency 1, input 8" in out and "only in B: concurrency 8, input 8" in out
    ra, rb = a["runs"][1], b["runs"][0]
    ratio = rb["output_throughput"] / ra["output_throughput"]
    line = next(l for l in out.splitlines() if l.strip().startswith("output throughput"))
    assert "%.3fx" % ratio in line and line.rstrip().endswith("B")
    line = next(l for l in out.splitlines() if l.strip().startswith("TTFT p99"))
    assert "%.3fx" % (rb["ttft_ms"]["p99"] / ra["ttft_ms"]["p99"]) in line and line.rstrip().endswith("B")
    line = next(l for l in out.splitlines() if l.strip().startswith("cost per 1M output tokens"))
    want = (rb["cost"]["usd_per_million_output_tokens"] / ra["cost"]["usd_per_million_output_tokens"])
    assert "%.3fx" % want in line

    # prices given to compare override the files' prices
    p = run_wafer("bench", "compare", tmp_path / "a.json", tmp_path / "b.json", "--cost-a", 1, "--cost-b", 1)
    line = next(l for l in p.stdout.splitlines() if l.strip().startswith("cost per request"))
    want = ra["request_throughput"] / rb["request_throughput"]
    assert "%.3fx" % want in line

    # no shared load point, or not a result file
    p = run_wafer("bench", "compare", tmp_path / "a.json", tmp_path / "a.json")
    assert p.returncode == 0
    (tmp_path / "c.json").write_text(json.dumps({**a, "runs": [dict(a["runs"][0], concurrency=64)]}))
    p = run_wafer("bench", "compare", tmp_path / "a.json", tmp_path / "c.json")
    assert p.returncode == 1 and "share no load point" in p.stderr
    (tmp_path / "x.json").write_text('{"hello": 1}')
    p = run_wafer("bench", "compare", tmp_path / "a.json", tmp_path / "x.json")
    assert p.returncode == 2 and "not a `wafer bench serve --json` result" in p.stderr
    p = run_wafer("bench", "compare", tmp_path / "a.json")
    assert p.returncode == 2


def _documented_fields():
    """Field paths from the tables of the "JSON result" section of docs/bench.md (rows "| `path` | ...")."""
    doc = (REPO / "docs" / "bench.md").read_text()
    section = doc.split("## JSON result", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\|\s*`([^`]+)`", section, re.M))


def _flatten(obj, prefix, out):
    dynamic = ("runs[].http_status", "runs[].error_samples")  # keys are status codes / error kinds
    metric = re.match(r"runs\[\]\.(ttft|tpot|itl|e2e)_ms$", prefix)
    if prefix and not prefix.endswith("[]"):
        out.add(prefix)
    if prefix in dynamic:
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if metric:
                out.add("<metric>." + k)
                continue
            path = prefix + "." + k if prefix else k
            if path.startswith("runs[].goodput.slo."):
                path = "config.slo." + k  # documented once
            _flatten(v, path, out)
    elif isinstance(obj, list):
        for v in obj:
            if isinstance(v, dict):
                _flatten(v, prefix + "[]", out)


def test_json_fields_match_docs(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"prompt": "hi", "expected_keywords": ["tok0"]}) + "\n")
    with StandinServer(ttft_ms=2, itl_ms=1) as srv:
        _, res = bench(tmp_path, srv.url + "/mix", "--num-prompts", 10, "--concurrency", "2", "--output-len", 3,
                       "--input-len", 4, "--slo", "ttft=1s,tpot=1s,itl=1s,e2e=5s", "--cost-per-hour", 1, "--detailed",
                       "--quality", q)
        _, conv = bench(tmp_path, srv.url, "--num-prompts", 2, "--turns", 2, "--output-len", 2, "--input-len", 4,
                        "--detailed", name="turns")
    produced = set()
    _flatten(res, "", produced)
    _flatten(conv, "", produced)  # runs[].turns[] exists only with --turns
    documented = _documented_fields()
    assert len(documented) > 60
    assert produced - documented == set(), "fields missing from docs/bench.md"
    assert documented - produced == set(), "documented fields the JSON does not have"
    # the fields the issue asks for, by name
    run = res["runs"][0]
    for k in ("completed", "failed", "duration_s", "request_throughput", "output_throughput",
              "total_token_throughput"):
        assert isinstance(run[k], (int, float))
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(run[m]) >= {"mean", "median", "p50", "p95", "p99"}


def test_progress_bar_only_on_a_terminal(tmp_path):
    import pty
    with StandinServer(ttft_ms=2, itl_ms=1) as srv:
        p, _ = bench(tmp_path, srv.url, "--num-prompts", 4, "--output-len", 2, "--input-len", 4)
        assert "\r" not in p.stderr and "[###" not in p.stderr
        master, slave = pty.openpty()
        proc = subprocess.Popen([WAFER, "bench", "serve", "--url", srv.url, "--num-prompts", "4", "--output-len",
                                 "2", "--input-len", "4", "--no-calibrate"], stdout=subprocess.DEVNULL,
                                stderr=slave)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(timeout=30) == 0
        os.close(master)
    tty = b"".join(chunks).decode(errors="replace")
    assert "4/4 requests" in tty and "##############################" in tty


# -- the HTML report in a real browser --------------------------------------------------------------------
def _png_pixels(path):
    """Decodes an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes) into (width, height, bpp, rows)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w, h, bpp = 8, b"", 0, 0, 3
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp
    lo7, hi1 = int.from_bytes(b"\x7f" * stride, "big"), int.from_bytes(b"\x80" * stride, "big")
    rows, prev = [], bytes(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)]
        if f == 2:  # Up: bytewise (line + prev) mod 256 as one big-integer sum with no carry across bytes
            a, b = int.from_bytes(line, "big"), int.from_bytes(prev, "big")
            line = (((a & lo7) + (b & lo7)) ^ ((a ^ b) & hi1)).to_bytes(stride, "big")
        elif f != 0:
            line = bytearray(line)
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = prev[i]
                if f == 1:
                    line[i] = (line[i] + a) & 255
                elif f == 3:
                    line[i] = (line[i] + ((a + b) >> 1)) & 255
                else:
                    c = prev[i - bpp] if i >= bpp else 0
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            line = bytes(line)
        rows.append(line)
        prev = line
    return w, h, bpp, rows


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="/usr/bin/chromium is absent: HTML report not rendered")
def test_html_report_shows_conversations(tmp_path):
    """With --turns the page adds TTFT and the prefix cache's share by turn (one line per run) and the per-turn
    table; Chromium builds the charts with their lines."""
    html = tmp_path / "turns.html"
    with StandinServer(ttft_ms=2, itl_ms=1, prefix_cache=True) as srv:
        _, res = bench(tmp_path, srv.url, "--turns", 3, "--concurrency", "1,2", "--num-prompts", 3, "--output-len", 3,
                       "--input-len", 6, "--html", html)
    profile = tempfile.mkdtemp(prefix="wafer-chromium-")
    try:
        p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                            "--user-data-dir=" + profile, "--dump-dom", html.as_uri()],
                           capture_output=True, text=True, timeout=60)
        dom = p.stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    for cid in ("chart-turns-ttft", "chart-turns-cached"):
        m = re.search(r'<svg[^>]*id="%s"[^>]*>(.*?)</svg>' % cid, dom, re.S)
        assert m, cid
        assert m.group(1).count("<polyline") == 2, cid  # one line per run
    table = re.search(r'<table id="turns">(.*?)</table>', dom, re.S)
    assert table and table.group(1).count("<tr>") == 1 + 2 * 3  # header, 2 runs x 3 turns
    hit = res["runs"][1]["turns"][2]["prefix_cache_hit_rate"]
    assert "<td>%.1f</td>" % (100 * hit) in table.group(1)


def test_html_report_renders_in_chromium(tmp_path):
    html = tmp_path / "report.html"
    with StandinServer(ttft_ms=20, itl_ms=3) as srv:
        bench(tmp_path, srv.url + "/mix", "--num-prompts", 10, "--concurrency", "1,2,4", "--output-len", 6,
              "--input-len", 8, "--html", html, "--label", "stand-in <script>", "--cost-per-hour", 1)
    text = html.read_text()
    assert "http://" not in text.replace(srv.url, "") .replace("http://www.w3.org/2000/svg", "")  # no network
    assert "<script" not in text and "stand-in &lt;script&gt;" in text
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "bench_report.png"
    if shot.exists():
        shot.unlink()
    profile = tempfile.mkdtemp(prefix="wafer-chromium-")
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--user-data-dir=" + profile, "--window-size=1280,2000"]
    try:
        p = subprocess.run(flags + ["--screenshot=" + str(shot), html.as_uri()], capture_output=True, timeout=60)
        assert shot.exists() and shot.stat().st_size > 20000, p.stderr[-2000:]
        p = subprocess.run(flags + ["--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=60)
        dom = p.stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    shutil.copy(html, ARTIFACTS / "bench_report.html")
    # the DOM the browser built has every chart with drawn content
    for cid in ("chart-cdf-ttft", "chart-cdf-tpot", "chart-cdf-itl", "chart-cdf-e2e", "chart-sweep-output-throughput",
                "chart-sweep-request-throughput", "chart-sweep-ttft", "chart-sweep-tpot", "chart-sweep-e2e",
                "chart-hist-1-ttft", "chart-hist-3-e2e"):
        m = re.search(r'<svg[^>]*id="%s"[^>]*>(.*?)</svg>' % cid, dom, re.S)
        assert m, cid
        assert "<polyline" in m.group(1) or 'class="bar"' in m.group(1), cid
    assert len(re.findall(r'<svg[^>]*class="chart"', dom)) == 9 + 3 * 4
    assert '<table id="summary">' in dom and '<table id="errors">' in dom
    # the screenshot is a page, not a blank: many colours, and the series colours are drawn
    w, h, bpp, rows = _png_pixels(shot)
    assert (w, h) == (1280, 2000)
    colours, counts = set(), {}
    for y in range(0, h, 2):
        row = rows[y]
        for x in range(0, w, 2):
            px = row[x * bpp:x * bpp + 3]
            colours.add(px)
            counts[px] = counts.get(px, 0) + 1
    assert len(colours) > 50
    white = counts.get(b"\xff\xff\xff", 0) + counts.get(b"\xfa\xfa\xfa", 0)
    assert white < 0.97 * sum(counts.values())
    blue, orange = bytes((0x1f, 0x77, 0xb4)), bytes((0xff, 0x7f, 0x0e))
    assert counts.get(blue, 0) > 50 and counts.get(orange, 0) > 50, (counts.get(blue), counts.get(orange))
