"""libwafer-client's batch jobs (wafer_jobs_* in include/wafer/client.h), through examples/batch_jobs.c and
`wafer jobs` (which is built on them): against a real wafer serve (stories260K: every custom_id once, greedy
results equal to the same request sent to /v1/completions alone, a line that fails at run time in the error
file, a file that is not JSONL refused at upload, cancel, list, unknown and malformed ids), and against the
faulty stand-in (faulty_openai.py) for the retries: 429 with Retry-After on a look at a batch, 503 and a reset
on the multipart upload (sent again whole), no retry after 400 or x-should-retry: false."""
import json
import os
import subprocess
import time

import pytest

from conftest import STORIES, WAFER_BIN
from faulty_openai import FaultyServer

EXAMPLES = os.path.join(os.path.dirname(WAFER_BIN), "examples")


def jobs(*args, timeout=120):
    env = {k: v for k, v in os.environ.items() if k not in ("WAFER_URL", "WAFER_API_KEY", "OPENAI_API_KEY")}
    return subprocess.run([WAFER_BIN, "jobs", *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env)


def example(name):
    path = os.path.join(EXAMPLES, name)
    if not os.path.exists(path):
        pytest.skip(f"{path} not built (run make examples)")
    return path


def alone(srv, body):
    r = srv.client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def request_lines(n, bad_model_at=None, max_tokens=16):
    out = []
    for i in range(n):
        body = {"prompt": "Once upon a time %d" % i, "max_tokens": max_tokens, "temperature": 0}
        if i == bad_model_at:
            body["model"] = "no-such-model"
        out.append({"custom_id": "r%d" % i, "method": "POST", "url": "/v1/completions", "body": body})
    return out


def write(path, reqs):
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    return path


@pytest.fixture
def faulty():
    s = FaultyServer()
    yield s
    s.close()


# ---------------------------------------------------------------- against wafer serve


def test_example_submit_wait_results(make_server):
    srv = make_server(STORIES, "--batch-inflight", "2")
    prompts = ["Once upon a time", "The cat", "Lily and Tom", "One day", "The sun was"]
    r = subprocess.run([example("batch_jobs"), srv.base] + prompts, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr + srv.log()[-2000:]
    assert "batch batch_" in r.stderr and "completed: 5/5 lines done" in r.stderr, r.stderr
    got = [json.loads(x) for x in r.stdout.splitlines()]
    assert sorted(x["custom_id"] for x in got) == ["p%d" % i for i in range(5)]  # every custom_id once
    for x in got:
        p = prompts[int(x["custom_id"][1:])]
        want = alone(srv, {"prompt": p, "max_tokens": 12, "temperature": 0})
        assert x["response"]["status_code"] == 200
        assert x["response"]["body"]["choices"][0]["text"] == want, x
    # the metadata and the file name went along
    b = srv.client.get("/v1/batches", params={"limit": 1}).json()["data"][0]
    assert b["metadata"] == {"example": "batch_jobs"}
    assert srv.client.get("/v1/files/" + b["input_file_id"]).json()["filename"] == "prompts.jsonl"


def test_failed_line_in_error_file_and_bad_file_refused(make_server, tmp_path):
    srv = make_server(STORIES, "--batch-inflight", "2")
    reqs = request_lines(6, bad_model_at=2)
    r = jobs("submit", write(tmp_path / "reqs.jsonl", reqs), "--url", srv.base, "--wait", "--interval", "0.1")
    assert r.returncode == 0, r.stderr
    bid = r.stdout.strip()
    assert "uploaded " in r.stderr and "6/6 lines" in r.stderr and "(1 failed)" in r.stderr, r.stderr
    out = [json.loads(x) for x in jobs("results", bid, "--url", srv.base).stdout.splitlines()]
    err = [json.loads(x) for x in jobs("results", bid, "--errors", "--url", srv.base).stdout.splitlines()]
    assert sorted(x["custom_id"] for x in out + err) == sorted("r%d" % i for i in range(6))
    assert [x["custom_id"] for x in err] == ["r2"] and err[0]["response"]["status_code"] != 200
    by_id = {q["custom_id"]: q["body"] for q in reqs}
    for x in out:
        assert x["response"]["body"]["choices"][0]["text"] == alone(srv, by_id[x["custom_id"]])
    # a line that is not JSON: the whole file is refused at upload, with the line's number
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(reqs[0]) + "\n{not json\n")
    r = jobs("submit", bad, "--url", srv.base)
    assert r.returncode == 1
    assert "uploading the file failed (HTTP 400): Line 2 is not valid JSON" in r.stderr, r.stderr
    assert "attempt 2" not in r.stderr  # a 400 is not retried


def test_cancel_list_and_unknown_ids(make_server, tmp_path, slow_model):
    srv = make_server(slow_model, "--batch-inflight", "1")
    # some 25 s of work at one line at a time (the slow model): --wait --timeout stops waiting (exit 1), the
    # batch goes on, and the cancel half a second later cuts it short (stories260K's 150 lines ran 1 s here)
    r = jobs("submit", write(tmp_path / "long.jsonl", request_lines(150, max_tokens=60)), "--url", srv.base,
             "--wait", "--interval", "0.1", "--timeout", "0.3")
    assert r.returncode == 1, r.stderr
    bid = r.stdout.strip()
    assert bid.startswith("batch_") and "is still in_progress after 0.3 s" in r.stderr and "it goes on" in r.stderr
    r = jobs("results", bid, "--url", srv.base)
    assert r.returncode == 1 and "its files come when it ends" in r.stderr
    r = jobs("cancel", bid, "--url", srv.base)
    assert r.returncode == 0 and ("cancelling" in r.stdout or "cancelled" in r.stdout), r.stdout + r.stderr
    deadline = time.time() + 60
    while time.time() < deadline:
        st = json.loads(jobs("status", bid, "--json", "--url", srv.base).stdout)
        if st["status"] == "cancelled":
            break
        time.sleep(0.2)
    assert st["status"] == "cancelled"
    ids = [json.loads(x)["custom_id"] for x in jobs("results", bid, "--errors", "--url", srv.base).stdout.splitlines()]
    if st["output_file_id"]:
        ids += [json.loads(x)["custom_id"] for x in jobs("results", bid, "--url", srv.base).stdout.splitlines()]
    assert sorted(ids) == sorted("r%d" % i for i in range(150))  # each once across both files
    assert 0 < len(ids) - st["request_counts"]["completed"] < 150  # the cancel cut it short
    r = jobs("list", "--url", srv.base, "--limit", "5")
    assert r.returncode == 0 and bid in r.stdout and "cancelled" in r.stdout
    lst = json.loads(jobs("list", "--json", "--url", srv.base).stdout)
    assert [b["id"] for b in lst["data"]] == [bid]
    # an unknown id: the server's 404 and its message, not retried
    r = jobs("status", "batch_nope", "--url", srv.base)
    assert r.returncode == 1 and "getting the batch failed (HTTP 404)" in r.stderr and "batch_nope" in r.stderr
    assert "attempt 2" not in r.stderr
    # an id that is not one never reaches the server (it would name another path)
    for bad in ("../files/x", "a b", "x?limit=1"):
        r = jobs("status", bad, "--url", srv.base)
        assert r.returncode == 1 and "is not an id" in r.stderr, r.stderr
    r = jobs("cancel", "..", "--url", srv.base)
    assert r.returncode == 1 and "is not an id" in r.stderr


# ---------------------------------------------------------------- retries against the faulty stand-in


def test_look_retried_after_429_retry_after(faulty):
    url = faulty.url("429ra1,ok")
    r = jobs("status", "batch_f1", "--url", url)
    assert r.returncode == 0, r.stderr
    assert "batch_f1  completed  2/2 lines done" in r.stdout
    assert "HTTP 429" in r.stderr and "attempt 2 in 1.00 s" in r.stderr
    t = [x["t"] for x in faulty.requests("429ra1,ok")]
    assert len(t) == 2 and 0.95 <= t[1] - t[0] < 1.6  # Retry-After: 1, not the 0.5 s backoff
    # results: the look and the download, each retried on its own
    r = jobs("results", "batch_f1", "--url", faulty.url("503,ok,reset,ok"))
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["custom_id"] for x in r.stdout.splitlines()] == ["a", "b"]
    paths = [x["path"].split("/", 3)[3] for x in faulty.requests("503,ok,reset,ok")]
    assert paths == ["v1/batches/batch_f1", "v1/batches/batch_f1", "v1/files/file-out/content",
                     "v1/files/file-out/content"]
    r = jobs("cancel", "batch_f1", "--url", faulty.url("429ms300,ok"))
    assert r.returncode == 0 and "cancelling" in r.stdout
    r = jobs("list", "--url", faulty.url("503,503,503"))
    assert r.returncode == 1 and "listing batches failed (HTTP 503)" in r.stderr
    assert len(faulty.requests("503,503,503")) == 3  # 1 + max_retries 2


def test_upload_retried_whole(faulty, tmp_path):
    src = write(tmp_path / "reqs.jsonl", request_lines(3))
    r = jobs("submit", src, "--url", faulty.url("503,reset,ok"), "--metadata", "k=v")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "batch_f1"
    reqs = faulty.requests("503,reset,ok")
    ups = [x for x in reqs if x["path"].endswith("/v1/files")]
    assert len(ups) == 3  # 503, reset, then accepted
    for u in ups:  # each attempt carried the whole file, with purpose=batch and its name
        text = u["body"]["multipart"]
        assert src.read_text() in text and 'name="purpose"' in text and "batch" in text
        assert 'filename="reqs.jsonl"' in text
    create = [x for x in reqs if x["path"].endswith("/v1/batches")]
    assert len(create) == 1 and create[0]["body"] == {"input_file_id": "file-f1", "endpoint": "/v1/completions",
                                                      "completion_window": "24h", "metadata": {"k": "v"}}
    # not retried: 400, and 503 with x-should-retry: false
    for script in ("400", "shouldnot"):
        r = jobs("submit", src, "--url", faulty.url(script))
        assert r.returncode == 1 and "uploading the file failed (HTTP" in r.stderr
        assert len(faulty.requests(script)) == 1, script


def test_unreachable(faulty, tmp_path):
    port = faulty.server_address[1]
    faulty.close()
    src = write(tmp_path / "reqs.jsonl", request_lines(1))
    t0 = time.monotonic()
    r = jobs("submit", src, "--url", "http://127.0.0.1:%d" % port)
    assert r.returncode == 1
    assert "cannot reach http://127.0.0.1:%d/v1/files" % port in r.stderr and "(after 3 attempts)" in r.stderr
    assert time.monotonic() - t0 < 5
