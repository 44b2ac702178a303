"""The Batch API in wafer serve (docs/jobs.md): files and batches round trip, the live endpoint's answers as
batch results (greedy results equal to the same request sent alone), bad input, and kill -9 of the server at
random points of one batch with restarts on the same data dir: every custom_id exactly once."""
import json
import random
import tempfile
import time

import httpx
import pytest

from conftest import STORIES, Server, need


def lines(n, model="stories260K", bad_model_at=None, max_tokens=24):
    out = []
    for i in range(n):
        body = {"model": "other" if i == bad_model_at else model, "prompt": f"Once upon a time {i}",
                "max_tokens": max_tokens, "temperature": 0}
        out.append({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": body})
    return out


def upload(srv, reqs, raw=None):
    data = raw if raw is not None else "".join(json.dumps(r) + "\n" for r in reqs)
    return srv.client.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", data)})


def create(srv, fid, endpoint="/v1/completions"):
    return srv.client.post("/v1/batches", json={"input_file_id": fid, "endpoint": endpoint,
                                                "completion_window": "24h"})


def wait_final(srv, bid, timeout=50):
    deadline = time.time() + timeout
    while time.time() < deadline:
        b = srv.client.get(f"/v1/batches/{bid}").json()
        if b["status"] in ("completed", "failed", "expired", "cancelled"):
            return b
        time.sleep(0.1)
    raise AssertionError(f"batch {bid} did not finish: {b}\n{srv.log()[-2000:]}")


def content(srv, fid):
    r = srv.client.get(f"/v1/files/{fid}/content")
    assert r.status_code == 200
    return [json.loads(x) for x in r.text.splitlines() if x]


def alone(srv, body):
    r = srv.client.post("/v1/completions", json=body)
    assert r.status_code == 200
    return r.json()["choices"][0]["text"]


def test_round_trip_and_errors(make_server):
    srv = make_server(STORIES)
    reqs = lines(12, bad_model_at=3)
    f = upload(srv, reqs)
    assert f.status_code == 200, f.text
    f = f.json()
    assert f["object"] == "file" and f["purpose"] == "batch" and f["filename"] == "in.jsonl"
    assert srv.client.get(f"/v1/files/{f['id']}").json()["id"] == f["id"]
    assert any(x["id"] == f["id"] for x in srv.client.get("/v1/files").json()["data"])
    b = create(srv, f["id"])
    assert b.status_code == 200, b.text
    b = wait_final(srv, b.json()["id"])
    assert b["status"] == "completed"
    assert b["request_counts"] == {"total": 12, "completed": 11, "failed": 1}
    out, err = content(srv, b["output_file_id"]), content(srv, b["error_file_id"])
    assert sorted(x["custom_id"] for x in out) == sorted(f"r{i}" for i in range(12) if i != 3)
    for x in out:
        i = int(x["custom_id"][1:])
        assert x["response"]["status_code"] == 200
        assert x["response"]["body"]["choices"][0]["text"] == alone(srv, reqs[i]["body"])
    assert len(err) == 1 and err[0]["custom_id"] == "r3"
    assert err[0]["response"]["status_code"] == 404
    live_err = srv.client.post("/v1/completions", json=reqs[3]["body"]).json()
    assert err[0]["response"]["body"] == live_err
    listed = srv.client.get("/v1/batches", params={"limit": 1}).json()
    assert listed["object"] == "list" and listed["data"][0]["id"] == b["id"]
    m = srv.metrics()
    assert m['wafer_batches{status="completed"}'] == 1
    assert m['wafer_batch_lines_total{outcome="completed"}'] == 11
    assert m['wafer_batch_lines_total{outcome="failed"}'] == 1
    assert m["wafer_batch_queue_lines"] == 0
    # bad input
    r = upload(srv, [], raw="")
    assert r.status_code == 400 and r.json()["error"]["code"] == "empty_file"
    r = create(srv, f["id"], endpoint="/v1/embeddings")
    assert r.status_code == 400 and "endpoint" in r.json()["error"]["message"]
    assert srv.client.get("/v1/batches/batch_nope").status_code == 404
    assert srv.client.get("/v1/files/file-nope").status_code == 404
    assert srv.client.get("/v1/files/file-nope/content").status_code == 404
    assert srv.client.post("/v1/batches/batch_nope/cancel").status_code == 404
    r = srv.client.post("/v1/files", content=b"x", headers={"Content-Type": "application/json"})
    assert r.status_code == 415
    d = srv.client.delete(f"/v1/files/{f['id']}")
    assert d.status_code == 200 and d.json()["deleted"] is True
    assert srv.client.get(f"/v1/files/{f['id']}").status_code == 404


def test_upload_limit_413(make_server):
    srv = make_server(STORIES, "--max-file-bytes", "2000")
    r = upload(srv, lines(40))  # about 5 KB: within the HTTP limit (upload limit + slack), refused by the store
    assert r.status_code == 413, r.text
    r = httpx.post(srv.url("/v1/files"), content=b"x" * (200 << 10),
                   headers={"Content-Type": "multipart/form-data; boundary=b"}, timeout=30)
    assert r.status_code == 413  # past the upload limit + slack: refused before the body is read


def test_cancel(make_server):
    srv = make_server(STORIES, "--batch-inflight", "1")
    f = upload(srv, lines(60, max_tokens=60)).json()
    b = create(srv, f["id"]).json()
    r = srv.client.post(f"/v1/batches/{b['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] in ("cancelling", "cancelled")
    b = wait_final(srv, b["id"])
    assert b["status"] == "cancelled"
    ids = [x["custom_id"] for x in content(srv, b["error_file_id"])]
    if b["output_file_id"]:
        ids += [x["custom_id"] for x in content(srv, b["output_file_id"])]
    assert sorted(ids) == sorted(f"r{i}" for i in range(60))


def test_kill9_restarts_exactly_once():
    need(STORIES)
    data = tempfile.mkdtemp(prefix="wafer-jobs-kill-")
    reqs = lines(80, max_tokens=40)
    rnd = random.Random(7)
    srv = Server(STORIES, "--data-dir", data, "--max-batch-size", "4")
    bid = create(srv, upload(srv, reqs).json()["id"]).json()["id"]
    kills = 0
    try:
        for _ in range(4):
            time.sleep(rnd.uniform(0.2, 1.0))
            b = srv.client.get(f"/v1/batches/{bid}").json()
            if b["status"] != "in_progress":
                break
            srv.kill()  # SIGKILL
            kills += 1
            srv = Server(STORIES, "--data-dir", data, "--max-batch-size", "4")
        b = wait_final(srv, bid)
        assert b["status"] == "completed", b
        out = content(srv, b["output_file_id"])
        ids = [x["custom_id"] for x in out]
        assert sorted(ids) == sorted(r["custom_id"] for r in reqs)  # each exactly once
        assert b["error_file_id"] is None
        by_id = {r["custom_id"]: r["body"] for r in reqs}
        for x in out[::7]:
            assert x["response"]["body"]["choices"][0]["text"] == alone(srv, by_id[x["custom_id"]])
        assert kills >= 1, "the batch finished before the first kill: make it longer"
    finally:
        srv.kill()


def test_lines_are_bounded_like_live_requests(make_server):
    """Batch lines are prepared by the live endpoint's code on a request worker, answer bounds included: a line
    whose answer could pass server.max_response gets the live request's 400 response_too_large as its result,
    and the lines next to it still run."""
    srv = make_server(STORIES, "--max-response", "4MiB")
    big = {"model": "stories260K", "prompt": ["Once upon a time"] * 64, "n": 16, "logprobs": 20, "max_tokens": 120}
    reqs = lines(3)
    reqs[1]["body"] = big
    b = create(srv, upload(srv, reqs).json()["id"])
    assert b.status_code == 200, b.text
    b = wait_final(srv, b.json()["id"])
    assert b["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    err = content(srv, b["error_file_id"])
    assert len(err) == 1 and err[0]["custom_id"] == "r1"
    assert err[0]["response"]["status_code"] == 400
    assert err[0]["response"]["body"]["error"]["code"] == "response_too_large"
    assert err[0]["response"]["body"] == srv.client.post("/v1/completions", json=big).json()
    assert sorted(x["custom_id"] for x in content(srv, b["output_file_id"])) == ["r0", "r2"]
