"""End-to-end tests of `wafer jobs` against a stand-in of OpenAI's Batch API (batch_standin.py) on loopback:
argument errors, submit (multipart upload, batch creation, --wait progress bar), list, status, results,
cancel, and the server's and the network's errors. The same commands against wafer serve come with the
server's /v1/batches routes."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from batch_standin import BatchStandin

REPO = Path(__file__).resolve().parents[2]
WAFER = os.environ.get("WAFER_BIN") or str(REPO / "build" / "wafer")

pytestmark = pytest.mark.skipif(not os.path.exists(WAFER), reason="wafer binary not built (run make): " + WAFER)


def jobs(*args, env=None, timeout=60):
    e = dict(os.environ)
    for k in ("WAFER_URL", "WAFER_API_KEY", "OPENAI_API_KEY"):
        e.pop(k, None)
    e.update(env or {})
    return subprocess.run([WAFER, "jobs", *map(str, args)], capture_output=True, text=True, timeout=timeout, env=e)


def write_requests(path, n, url="/v1/chat/completions"):
    with open(path, "w") as f:
        for i in range(n):
            body = ({"model": "m", "messages": [{"role": "user", "content": "q%d" % i}]} if "chat" in url
                    else {"model": "m", "prompt": "q%d" % i})
            f.write(json.dumps({"custom_id": "r%d" % i, "method": "POST", "url": url, "body": body}) + "\n")
    return path


def test_help():
    r = jobs("--help")
    assert r.returncode == 0 and "usage: wafer jobs <command>" in r.stdout
    for sub in ("submit", "list", "status", "results", "cancel"):
        r = jobs(sub, "--help")
        assert r.returncode == 0, sub
        assert r.stdout.startswith("usage: wafer jobs " + sub), r.stdout
    r = subprocess.run([WAFER, "--help"], capture_output=True, text=True)
    assert "jobs" in r.stdout


@pytest.mark.parametrize("args,message", [
    ([], "usage: wafer jobs <command>"),
    (["nope"], "unknown command 'nope'"),
    (["submit"], "missing FILE.jsonl"),
    (["status"], "missing the batch ID"),
    (["status", "a", "b"], "unexpected argument 'b'"),
    (["list", "--limit", "0"], "--limit: expected an integer in [1, 100], got '0'"),
    (["list", "--limit"], "missing the value of '--limit'"),
    (["submit", "f.jsonl", "--endpoint", "/v1/embeddings"], "expected /v1/chat/completions or /v1/completions"),
    (["submit", "f.jsonl", "--metadata", "novalue"], "--metadata: expected KEY=VALUE"),
    (["submit", "f.jsonl", "--interval", "x"], "--interval: expected a number"),
    (["submit", "f.jsonl", "--wait", "--timeout", "-1"], "--timeout: expected a number in [0, 1e+07]"),
    (["status", "b1", "--timeout", "1"], "unknown option '--timeout'"),
    (["results", "b1", "--wait"], "unknown option '--wait'"),
    (["cancel", "b1", "--url", "ftp://x"], "--url: expected http://HOST:PORT"),
])
def test_bad_arguments(args, message):
    r = jobs(*args)
    assert r.returncode == 2, (args, r.stderr)
    assert message in r.stderr, r.stderr


def test_submit_wait_results_list_status(tmp_path):
    src = write_requests(tmp_path / "reqs.jsonl", 30)
    with BatchStandin(lines_per_s=30) as s:
        r = jobs("submit", src, "--url", s.url + "/v1/", "--wait", "--interval", "0.2", "--metadata", "job=nightly",
                 env={"WAFER_API_KEY": "sk-test"})
        assert r.returncode == 0, r.stderr
        bid = r.stdout.strip()
        assert bid.startswith("batch_standin")
        # progress: lines done of total, rate, ETA; then the final summary
        assert "30/30 lines" in r.stderr and "lines/s" in r.stderr and "ETA" in r.stderr, r.stderr
        assert "completed" in r.stderr
        # the upload was multipart/form-data with purpose=batch and the file's name; the key went along
        posts = [rec for rec in s.records if rec[0] == "POST" and rec[1] == "/v1/files"]
        assert posts and posts[0][2]["Content-Type"].startswith("multipart/form-data")
        assert posts[0][2]["Authorization"] == "Bearer sk-test"
        req = s.created_requests[0]
        assert req["endpoint"] == "/v1/chat/completions"  # from the file's first request
        assert req["completion_window"] == "24h" and req["metadata"] == {"job": "nightly"}
        assert s.files[req["input_file_id"]]["meta"]["filename"] == "reqs.jsonl"

        out = tmp_path / "out.jsonl"
        r = jobs("results", bid, "-o", out, "--url", s.url)
        assert r.returncode == 0, r.stderr
        lines = [json.loads(x) for x in out.read_text().splitlines()]
        assert sorted(x["custom_id"] for x in lines) == sorted("r%d" % i for i in range(30))
        assert all(x["response"]["body"]["echo"] == "q" + x["custom_id"][1:] for x in lines)
        r = jobs("results", bid, "--url", s.url)  # to stdout
        assert r.returncode == 0 and r.stdout == out.read_text()
        r = jobs("results", bid, "--errors", "--url", s.url)
        assert r.returncode == 1 and "has no error file" in r.stderr

        r = jobs("status", bid, env={"WAFER_URL": s.url})
        assert r.returncode == 0 and bid in r.stdout and "completed" in r.stdout and "30/30 lines done" in r.stdout
        r = jobs("status", bid, "--json", "--url", s.url)
        assert json.loads(r.stdout)["status"] == "completed"
        r = jobs("list", "--url", s.url)
        assert r.returncode == 0 and bid in r.stdout and "30/30" in r.stdout
        assert "limit=20" in [rec[1] for rec in s.records if rec[1].startswith("/v1/batches?")][0]
        r = jobs("list", "--limit", "1", "--json", "--url", s.url)
        assert json.loads(r.stdout)["data"][0]["id"] == bid


def test_cancel_and_partial_results(tmp_path):
    src = write_requests(tmp_path / "reqs.jsonl", 200, url="/v1/completions")
    with BatchStandin(lines_per_s=20) as s:
        r = jobs("submit", src, "--url", s.url, "--endpoint", "/v1/completions")
        assert r.returncode == 0, r.stderr
        bid = r.stdout.strip()
        r = jobs("results", bid, "--url", s.url)
        assert r.returncode == 1 and "its files come when it ends" in r.stderr
        time.sleep(0.5)  # some lines done, most not
        r = jobs("cancel", bid, "--url", s.url)
        assert r.returncode == 0, r.stderr
        assert "cancelled" in r.stdout
        out = jobs("results", bid, "--url", s.url).stdout.splitlines()
        err = jobs("results", bid, "--errors", "--url", s.url).stdout.splitlines()
        ids = [json.loads(x)["custom_id"] for x in out + err]
        assert sorted(ids) == sorted("r%d" % i for i in range(200))  # each once, across both files
        assert all(json.loads(x)["error"]["code"] == "batch_cancelled" for x in err)
        assert 0 < len(out) < 200


def test_server_errors_are_shown(tmp_path):
    with BatchStandin() as s:
        empty = tmp_path / "empty.jsonl"
        empty.write_text("\n")
        r = jobs("submit", empty, "--url", s.url)
        assert r.returncode == 1
        assert "uploading the file failed (HTTP 400): The file has no requests." in r.stderr
        emb = write_requests(tmp_path / "emb.jsonl", 2, url="/v1/embeddings")
        r = jobs("submit", emb, "--url", s.url)
        assert r.returncode == 1
        assert "creating the batch failed (HTTP 400): Invalid value for 'endpoint'" in r.stderr
        r = jobs("status", "batch_nope", "--url", s.url)
        assert r.returncode == 1 and "(HTTP 404)" in r.stderr and "batch_nope" in r.stderr
        r = jobs("submit", tmp_path / "missing.jsonl", "--url", s.url)
        assert r.returncode == 1 and "cannot open" in r.stderr


def test_unreachable_server():
    r = jobs("list", "--url", "http://127.0.0.1:1")
    assert r.returncode == 1
    assert "cannot reach http://127.0.0.1:1/v1/batches" in r.stderr and "--url" in r.stderr
