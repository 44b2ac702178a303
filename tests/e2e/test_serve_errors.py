"""A table of bad requests: each gets its documented status, OpenAI-shaped error (type, param, code, message),
and the server keeps serving afterwards."""
import socket
import time

import httpx
import pytest

from conftest import STORIES

BIG = "Once upon a time, there was a little girl named Lily. " * 40  # far past the 128-token context

CASES = [
    # (name, method, path, body (str = raw), headers, status, type, param, code, message fragment)
    ("malformed json", "POST", "/v1/completions", '{"prompt": "x"', None, 400, "invalid_request_error", None,
     "format", "malformed JSON"),
    ("not an object", "POST", "/v1/chat/completions", "[1, 2]", None, 400, "invalid_request_error", None,
     "invalid_argument", "must be a JSON object"),
    ("missing prompt", "POST", "/v1/completions", {"max_tokens": 3}, None, 400, "invalid_request_error", "prompt",
     "invalid_argument", "'prompt' is required"),
    ("prompt wrong type", "POST", "/v1/completions", {"prompt": 3}, None, 400, "invalid_request_error", "prompt",
     "invalid_argument", "got an integer"),
    ("temperature string", "POST", "/v1/completions", {"prompt": "x", "temperature": "hot"}, None, 400,
     "invalid_request_error", "temperature", "invalid_argument", "must be a number"),
    ("negative max_tokens", "POST", "/v1/completions", {"prompt": "x", "max_tokens": -5}, None, 400,
     "invalid_request_error", "max_tokens", "invalid_argument", "between 1 and"),
    ("huge max_tokens", "POST", "/v1/completions", {"prompt": "x", "max_tokens": 10 ** 12}, None, 400,
     "invalid_request_error", "max_tokens", "invalid_argument", "between 1 and"),
    ("max_tokens past context", "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 1000}, None, 400,
     "invalid_request_error", "max_tokens", "context_length_exceeded", "maximum context length is 128 tokens"),
    ("prompt past context", "POST", "/v1/completions", {"prompt": BIG, "max_tokens": 4}, None, 400,
     "invalid_request_error", "max_tokens", "context_length_exceeded", "in the prompt"),
    ("prompt past context, no max", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": BIG}]}, None, 400, "invalid_request_error", "prompt",
     "context_length_exceeded", "maximum context length is 128 tokens"),
    ("unknown model", "POST", "/v1/completions", {"model": "gpt-4", "prompt": "x"}, None, 404,
     "invalid_request_error", "model", "model_not_found", "gpt-4"),
    ("bad role", "POST", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, None, 400,
     "invalid_request_error", "messages[0].role", "invalid_argument", "must be one of"),
    ("n too large", "POST", "/v1/completions", {"prompt": "x", "n": 17}, None, 400, "invalid_request_error", "n",
     "invalid_argument", "between 1 and 16"),
    ("token id out of vocab", "POST", "/v1/completions", {"prompt": [1, 5000]}, None, 400, "invalid_request_error",
     "prompt", "invalid_argument", "outside the vocabulary"),
    ("tools", "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{}]}, None,
     400, "invalid_request_error", "tools[0]", "invalid_argument", "must be {\"type\": \"function\""),
    ("functions", "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                   "functions": [{"name": "a"}]}, None,
     400, "invalid_request_error", "functions", "unsupported", "not supported"),
    ("wrong method", "GET", "/v1/completions", None, None, 405, "invalid_request_error", None,
     "method_not_allowed", "use POST"),
    ("unknown route", "GET", "/v2/nothing", None, None, 404, "invalid_request_error", None, "not_found",
     "Unknown route"),
    ("content type", "POST", "/v1/completions", "prompt=x", {"Content-Type": "multipart/form-data; boundary=x"},
     415, "invalid_request_error", None, "unsupported_media_type", "application/json"),
    ("bad query", "GET", "/v1/generate_stream?prompt=x&max_new_tokens=lots", None, None, 400,
     "invalid_request_error", "max_new_tokens", "invalid_argument", "must be an integer"),
]


@pytest.fixture(scope="module")
def err_server():
    from conftest import Server, need
    s = Server(need(STORIES), "--max-body", "64KiB", "--header-timeout", "1", "--chat-template", "chatml")
    yield s
    assert s.close() == 0


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request_table(err_server, case):
    name, method, path, body, headers, status, etype, param, code, frag = case
    kw = {"headers": headers or {}}
    if isinstance(body, str):
        kw["content"] = body
        kw["headers"].setdefault("Content-Type", "application/json")
    elif body is not None:
        kw["json"] = body
    r = err_server.client.request(method, path, **kw)
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"}
    assert e["type"] == etype
    assert e["param"] == param
    assert e["code"] == code
    assert frag in e["message"], e["message"]
    if status == 405:
        assert r.headers["allow"] == "POST"
    # and the server keeps serving
    ok = err_server.client.post("/v1/completions", json={"prompt": "Once", "max_tokens": 2})
    assert ok.status_code == 200


def test_context_error_names_both_counts(err_server):
    r = err_server.client.post("/v1/completions", json={"prompt": BIG, "max_tokens": 4})
    msg = r.json()["error"]["message"]
    n_prompt = len(err_server.client.post("/tokenize", json={"content": BIG}).json()["tokens"])
    assert f"{n_prompt} in the prompt" in msg and "4 for the completion" in msg


def test_body_too_large(err_server):
    r = err_server.client.post("/v1/completions", json={"prompt": "x" * 100_000})
    assert r.status_code == 413
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert err_server.client.get("/health").status_code == 200


def test_slow_headers(err_server):
    host, port = err_server.base[len("http://"):].split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and then nothing
    s.settimeout(5)
    t0 = time.time()
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert 0.8 < time.time() - t0 < 4
    assert err_server.client.get("/health").status_code == 200


def test_expect_continue_and_keepalive(err_server):
    host, port = err_server.base[len("http://"):].split(":")
    body = b'{"prompt": "Once", "max_tokens": 2, "temperature": 0}'
    s = socket.create_connection((host, int(port)))
    s.settimeout(10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Expect: 100-continue\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 100")
    s.sendall(body)
    resp = b""
    while b"\r\n\r\n" not in resp:
        resp += s.recv(4096)
    assert resp.startswith(b"HTTP/1.1 200")
    # same connection, second request
    head, rest = resp.split(b"\r\n\r\n", 1)
    length = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
    while len(rest) < length:
        rest += s.recv(4096)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    resp2 = b""
    while b"ok" not in resp2:
        resp2 += s.recv(4096)
    assert resp2.startswith(b"HTTP/1.1 200")
    s.close()
