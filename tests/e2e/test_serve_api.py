"""Every endpoint of wafer serve, streaming and not, with exact response shapes (stories260K on loopback)."""
import json
import subprocess

import httpx
import pytest

from conftest import STORIES, LLAMA19M, WAFER_BIN, need

COMPLETION_KEYS = {"id", "object", "created", "model", "system_fingerprint", "choices", "usage"}
USAGE_KEYS = {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details",
              "completion_tokens_details"}
DETAIL_KEYS = {"accepted_prediction_tokens", "rejected_prediction_tokens", "draft_tokens", "accepted_draft_tokens"}


def sse_events(resp):
    """data: payloads of an SSE response, in order ([DONE] included as the string)."""
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in resp.text.split("\n\n"):
        block = block.strip()
        if not block:
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def check_usage(u, prompt_tokens=None, completion_tokens=None, openai=True):
    """openai: the OpenAI endpoints' usage (with completion_tokens_details), else the simple API's."""
    assert set(u) == (USAGE_KEYS if openai else USAGE_KEYS - {"completion_tokens_details"})
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert set(u["prompt_tokens_details"]) == {"cached_tokens"}
    assert 0 <= u["prompt_tokens_details"]["cached_tokens"] < u["prompt_tokens"]
    if prompt_tokens is not None:
        assert u["prompt_tokens"] == prompt_tokens
    if completion_tokens is not None:
        assert u["completion_tokens"] == completion_tokens
    if not openai:
        return
    d = u["completion_tokens_details"]
    assert set(d) == DETAIL_KEYS
    assert 0 <= d["accepted_prediction_tokens"] <= d["accepted_draft_tokens"] <= d["draft_tokens"]
    assert 0 <= d["rejected_prediction_tokens"] <= d["draft_tokens"] - d["accepted_draft_tokens"]


def test_health_ready_models(stories_server):
    c = stories_server.client
    r = c.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    # the version and commit wafer --version prints
    v = subprocess.run([WAFER_BIN, "--version"], capture_output=True, text=True).stdout
    assert set(r.json()) == {"status", "version", "commit"} and r.json()["version"] in v and r.json()["commit"] in v
    r = c.get("/ready")
    assert r.status_code == 200 and r.json() == {"status": "ready"}
    r = c.get("/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"object", "data"} and body["object"] == "list"
    ids = [m["id"] for m in body["data"]]
    assert ids == ["stories260K", "tiny"]
    m = body["data"][0]
    assert set(m) == {"id", "object", "created", "owned_by", "meta"}
    assert m["object"] == "model" and m["owned_by"] == "wafer"
    assert m["meta"]["context_length"] == 128 and m["meta"]["n_vocab"] == 512
    r = c.get("/v1/models/tiny")
    assert r.status_code == 200 and r.json()["id"] == "tiny"
    r = c.get("/v1/models/gpt-4")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_completion_shape_and_greedy_determinism(stories_server):
    c = stories_server.client
    req = {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}
    r = c.post("/v1/completions", json=req)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == COMPLETION_KEYS
    assert body["object"] == "text_completion" and body["model"] == "stories260K"
    assert body["id"].startswith("cmpl-")
    assert len(body["choices"]) == 1
    ch = body["choices"][0]
    assert set(ch) == {"index", "text", "logprobs", "finish_reason"}
    assert ch["index"] == 0 and ch["logprobs"] is None and ch["finish_reason"] == "length"
    assert len(ch["text"]) > 20
    check_usage(body["usage"], completion_tokens=24)
    # the alias works and greedy output is the same
    r2 = c.post("/v1/completions", json=dict(req, model="tiny"))
    assert r2.json()["choices"][0]["text"] == ch["text"]
    assert r2.json()["model"] == "stories260K"
    # prefix reuse shows up as cached tokens once the prompt spans a full block
    long_prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."
    c.post("/v1/completions", json={"prompt": long_prompt, "max_tokens": 4, "temperature": 0})
    r3 = c.post("/v1/completions", json={"prompt": long_prompt, "max_tokens": 4, "temperature": 0})
    assert r3.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16


def test_completion_stream(stories_server):
    c = stories_server.client
    req = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
    full = c.post("/v1/completions", json=req).json()
    r = c.post("/v1/completions", json=dict(req, stream=True, stream_options={"include_usage": True}))
    assert r.status_code == 200
    ev = sse_events(r)
    assert ev[-1] == "[DONE]"
    usage_chunk = ev[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["object"] == "text_completion"
    check_usage(usage_chunk["usage"], completion_tokens=12)
    chunks = ev[:-2]
    assert all(set(e) == COMPLETION_KEYS for e in chunks)
    assert len({e["id"] for e in chunks}) == 1
    text = "".join(e["choices"][0]["text"] for e in chunks)
    assert text == full["choices"][0]["text"]
    assert [e["choices"][0]["finish_reason"] for e in chunks][-1] == "length"
    assert all(e["choices"][0]["finish_reason"] is None for e in chunks[:-1])
    assert len(chunks) >= 10  # one chunk per token
    # without include_usage: no usage chunk, no usage key
    ev = sse_events(c.post("/v1/completions", json=dict(req, stream=True)))
    assert ev[-1] == "[DONE]" and all("usage" not in e for e in ev[:-1])


def test_chat_and_chat_stream(stories_server):
    c = stories_server.client
    msgs = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Tell me about Lily."}]
    r = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 10, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == COMPLETION_KEYS and body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    ch = body["choices"][0]
    assert set(ch) == {"index", "message", "logprobs", "finish_reason"}
    assert ch["message"]["role"] == "assistant" and isinstance(ch["message"]["content"], str)
    check_usage(body["usage"])
    r = c.post("/v1/chat/completions",
               json={"messages": msgs, "max_tokens": 10, "temperature": 0, "stream": True,
                     "stream_options": {"include_usage": True}})
    ev = sse_events(r)
    assert ev[-1] == "[DONE]"
    chunks = [e for e in ev[:-1] if e["choices"]]
    assert all(e["object"] == "chat.completion.chunk" for e in ev[:-1])
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in chunks)
    assert text == ch["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == ch["finish_reason"]
    assert ev[-2]["usage"] == body["usage"] or ev[-2]["usage"]["completion_tokens"] == body["usage"]["completion_tokens"]


def test_n_logprobs_stop_seed_echo(stories_server):
    c = stories_server.client
    # n greedy choices are identical and indexed
    r = c.post("/v1/completions", json={"prompt": "The cat", "max_tokens": 8, "temperature": 0, "n": 3}).json()
    assert [ch["index"] for ch in r["choices"]] == [0, 1, 2]
    assert len({ch["text"] for ch in r["choices"]}) == 1
    assert r["usage"]["completion_tokens"] == 24
    # seeded sampling is reproducible
    req = {"prompt": "The cat", "max_tokens": 16, "temperature": 1.0, "seed": 7}
    a = c.post("/v1/completions", json=req).json()["choices"][0]["text"]
    b = c.post("/v1/completions", json=req).json()["choices"][0]["text"]
    assert a == b
    # logprobs (completions): tokens, token_logprobs, top_logprobs, text_offset
    r = c.post("/v1/completions", json={"prompt": "The cat", "max_tokens": 5, "temperature": 0, "logprobs": 2}).json()
    lp = r["choices"][0]["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == 5 and len(lp["top_logprobs"]) == 5
    assert all(v <= 0 for v in lp["token_logprobs"])
    assert "".join(lp["tokens"]) == r["choices"][0]["text"]
    for tok, l, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) <= 2 and max(top.values()) == pytest.approx(l, abs=1e-5)  # greedy picks the top one
    # chat logprobs
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                              "temperature": 0, "logprobs": True, "top_logprobs": 3}).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == 3
    assert set(content[0]) == {"token", "logprob", "bytes", "top_logprobs"}
    assert len(content[0]["top_logprobs"]) == 3
    # stop: the text ends right before the stop string
    full = c.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 30,
                                           "temperature": 0}).json()["choices"][0]["text"]
    stop = full[10:14]
    r = c.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0,
                                        "stop": [stop]}).json()
    assert r["choices"][0]["text"] == full[:full.index(stop)]
    assert r["choices"][0]["finish_reason"] == "stop"
    # echo
    r = c.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 3, "temperature": 0, "echo": True})
    assert r.json()["choices"][0]["text"].startswith("Once upon")
    # several prompts: choices in prompt order
    r = c.post("/v1/completions", json={"prompt": ["Once upon a time", "The cat"], "max_tokens": 4,
                                        "temperature": 0}).json()
    assert [ch["index"] for ch in r["choices"]] == [0, 1]
    single = c.post("/v1/completions", json={"prompt": "The cat", "max_tokens": 4, "temperature": 0}).json()
    assert r["choices"][1]["text"] == single["choices"][0]["text"]


def test_simple_api(stories_server):
    c = stories_server.client
    r = c.post("/v1/generate", json={"prompt": "Once upon a time", "max_new_tokens": 10, "do_sample": False})
    assert r.status_code == 200, r.text
    g = r.json()
    assert set(g) == {"text", "tokens", "finish_reason", "usage"}
    assert len(g["tokens"]) == 10 and all(isinstance(t, int) for t in g["tokens"])
    assert g["finish_reason"] == "length"
    check_usage(g["usage"], completion_tokens=10, openai=False)
    oa = c.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0}).json()
    assert g["text"] == oa["choices"][0]["text"]
    # tokens detokenize to the text
    d = c.post("/detokenize", json={"tokens": g["tokens"]}).json()
    assert d == {"content": g["text"]}
    # batch: results in request order, each with its own error
    r = c.post("/v1/batch_generate", json={
        "requests": [{"prompt": "Once upon a time"}, {"prompt": 5}, {"prompt": "The cat", "max_new_tokens": 500},
                     {"prompt": "Once upon a time", "max_new_tokens": 3}],
        "common_params": {"max_new_tokens": 10, "do_sample": False}})
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    assert len(res) == 4
    assert res[0]["text"] == g["text"] and res[0]["tokens"] == g["tokens"]
    assert res[1]["error"]["param"] == "requests[1].prompt" and res[1]["error"]["type"] == "invalid_request_error"
    assert res[2]["error"]["code"] == "context_length_exceeded"
    assert res[3]["tokens"] == g["tokens"][:3]
    # generate_stream: one event per token, then the summary, then [DONE]
    r = c.get("/v1/generate_stream", params={"prompt": "Once upon a time", "max_new_tokens": 10,
                                             "do_sample": "false"})
    assert r.status_code == 200
    ev = sse_events(r)
    assert ev[-1] == "[DONE]"
    last = ev[-2]
    assert last["finish_reason"] == "length" and last["generated_text"] == g["text"]
    toks = [e["token"] for e in ev[:-2]]
    assert [t["id"] for t in toks] == g["tokens"]
    assert "".join(t["text"] for t in toks) + last.get("token", {}).get("text", "") == g["text"]
    # /v1/generate with stream: true streams the same way
    ev2 = sse_events(c.post("/v1/generate", json={"prompt": "Once upon a time", "max_new_tokens": 10,
                                                  "do_sample": False, "stream": True}))
    assert ev2[-2]["generated_text"] == g["text"]


def test_tokenize_detokenize(stories_server):
    c = stories_server.client
    r = c.post("/tokenize", json={"content": "Once upon a time"})
    assert r.status_code == 200
    toks = r.json()["tokens"]
    assert toks[0] == 1 and len(toks) >= 4  # BOS first
    r2 = c.post("/tokenize", json={"content": "Once upon a time", "add_special": False, "with_pieces": True})
    pieces = r2.json()["tokens"]
    assert [p["id"] for p in pieces] == toks[1:]
    assert "".join(p["piece"] for p in pieces).strip() == "Once upon a time"
    d = c.post("/detokenize", json={"tokens": toks[1:]}).json()["content"]
    assert d.strip() == "Once upon a time"
    r = c.post("/detokenize", json={"tokens": [1, 99999]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"


def test_metrics_format(stories_server):
    from prometheus_client.parser import text_string_to_metric_families
    c = stories_server.client
    c.post("/v1/completions", json={"prompt": "Once", "max_tokens": 3, "temperature": 0})
    text = c.get("/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ["wafer_requests", "wafer_requests_running", "wafer_requests_waiting", "wafer_kv_blocks_used",
                 "wafer_kv_blocks_total", "wafer_prompt_tokens", "wafer_generation_tokens",
                 "wafer_prefix_cache_hits", "wafer_time_to_first_token_seconds", "wafer_inter_token_latency_seconds",
                 "wafer_request_duration_seconds", "wafer_queue_time_seconds"]:
        assert name in fams, name
    assert fams["wafer_time_to_first_token_seconds"].type == "histogram"
    ok = [s for s in fams["wafer_requests"].samples
          if s.labels.get("endpoint") == "/v1/completions" and s.labels.get("status") == "200"]
    assert ok and ok[0].value >= 1
    m = stories_server.metrics()
    assert m["wafer_kv_blocks_total"] > 0
    assert m["wafer_generation_tokens_total"] >= 3


def test_cors(stories_server):
    c = stories_server.client
    r = c.options("/v1/chat/completions", headers={"Origin": "https://app.example",
                                                   "Access-Control-Request-Method": "POST"})
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in r.headers["access-control-allow-methods"]
    r = c.get("/v1/models", headers={"Origin": "https://app.example"})
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    r = c.get("/v1/models", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_auth(make_server, tmp_path):
    keyfile = tmp_path / "keys"
    keyfile.write_text("# keys\nsk-file\n")
    s = make_server(STORIES, "--api-key", "sk-one", "--api-key-file", str(keyfile))
    body = {"prompt": "Once", "max_tokens": 2}
    r = httpx.post(s.url("/v1/completions"), json=body)
    assert r.status_code == 401
    e = r.json()["error"]
    assert e["type"] == "authentication_error" and e["code"] == "invalid_api_key" and "Missing API key" in e["message"]
    r = httpx.post(s.url("/v1/completions"), json=body, headers={"Authorization": "Bearer sk-two"})
    assert r.status_code == 401 and "Incorrect API key" in r.json()["error"]["message"]
    for key in ["sk-one", "sk-file"]:
        r = httpx.post(s.url("/v1/completions"), json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
    assert httpx.get(s.url("/health")).status_code == 200  # liveness needs no key
    assert httpx.get(s.url("/v1/models")).status_code == 401


def test_chat_without_template(make_server):
    s = make_server(STORIES)
    r = httpx.post(s.url("/v1/chat/completions"), json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400
    e = r.json()["error"]
    assert e["code"] == "chat_template_unavailable" and "--chat-template" in e["message"]
    # completions still work
    assert httpx.post(s.url("/v1/completions"), json={"prompt": "Once", "max_tokens": 2}).status_code == 200


def test_config_file(make_server, tmp_path):
    cfg = tmp_path / "wafer.yaml"
    cfg.write_text(f"model:\n  name: storyteller\n  path: {need(STORIES)}\n  chat_template: zephyr\n"
                   "server:\n  max_batch_size: 4\ngeneration:\n  max_new_tokens: 7\n  temperature: 0\n")
    s = make_server(None, "--config", str(cfg))
    assert httpx.get(s.url("/v1/models")).json()["data"][0]["id"] == "storyteller"
    r = httpx.post(s.url("/v1/completions"), json={"prompt": "Once"}).json()
    assert r["usage"]["completion_tokens"] == 7  # generation.max_new_tokens is the default max_tokens
    r = httpx.post(s.url("/v1/chat/completions"), json={"messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 2})
    assert r.status_code == 200


@pytest.mark.parametrize("yaml_text,needle", [
    ("server:\n  port: 99999\n", "wafer.yaml:2: server.port"),
    ("server:\n  max_batch: 4\n", "wafer.yaml:2: unknown key 'max_batch'"),
    ("model:\n  path: /nonexistent/model.gguf\n", "wafer.yaml:2: model.path: cannot open model file"),
])
def test_bad_config_exits_nonzero(tmp_path, yaml_text, needle):
    import subprocess
    from conftest import WAFER_BIN, need
    need(STORIES)
    cfg = tmp_path / "wafer.yaml"
    cfg.write_text(yaml_text)
    p = subprocess.run([WAFER_BIN, "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert needle in p.stderr, p.stderr


def test_bad_model_file(tmp_path):
    import subprocess
    from conftest import WAFER_BIN, need
    need(STORIES)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    p = subprocess.run([WAFER_BIN, "serve", "--model", str(bad), "--port", "0"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 1
    assert "--model: cannot load model" in p.stderr and str(bad) in p.stderr


def test_prediction_same_text(make_server):
    """Predicted outputs and n-gram drafts change the speed, never the answer: the same text as without, for a
    right, a partly right and a wrong prediction, greedy and seeded, streamed and not, chat too; the usage
    reports what was accepted and rejected; /metrics counts the drafts."""
    s = make_server(STORIES, "--chat-template", "chatml", "--draft-fixed", "true")
    c = s.client
    req = {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0}
    plain = c.post("/v1/completions", json=req).json()
    text = plain["choices"][0]["text"]
    d0 = plain["usage"]["completion_tokens_details"]
    assert d0["draft_tokens"] == 0 and d0["accepted_prediction_tokens"] == 0
    words = text.split(" ")
    edited = " ".join(w if i % 5 != 3 else "zebra" for i, w in enumerate(words))
    for pred, kind in [(text, "exact"), (edited, "partly"), ("the the the the", "wrong"), ("", "empty")]:
        r = c.post("/v1/completions", json=dict(req, prediction={"type": "content", "content": pred}))
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["text"] == text, kind
        check_usage(body["usage"], completion_tokens=48)
        d = body["usage"]["completion_tokens_details"]
        if kind in ("exact", "partly"):
            assert d["accepted_prediction_tokens"] > 0, (kind, d)
        if kind == "exact":
            assert d["accepted_prediction_tokens"] >= 24, d
        if kind == "partly":
            assert d["rejected_prediction_tokens"] > 0, d
        if kind == "empty":
            assert d["draft_tokens"] == 0, d
    # text parts, streaming with usage
    r = c.post("/v1/completions", json=dict(req, stream=True, stream_options={"include_usage": True},
                                            prediction={"type": "content", "content": [{"type": "text", "text": text}]}))
    ev = sse_events(r)
    assert "".join(e["choices"][0]["text"] for e in ev[:-2]) == text
    assert ev[-2]["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0
    # n-gram drafts asked by the request (the server's default is off)
    r = c.post("/v1/completions", json=dict(req, speculation="ngram")).json()
    assert r["choices"][0]["text"] == text
    assert r["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] == 0
    # seeded sampling with logprobs: the same tokens and logprobs
    sreq = dict(req, temperature=0.9, top_k=40, seed=77, logprobs=2)
    a = c.post("/v1/completions", json=sreq).json()["choices"][0]
    b = c.post("/v1/completions", json=dict(sreq, prediction={"type": "content", "content": a["text"]})).json()
    assert b["choices"][0]["text"] == a["text"] and b["choices"][0]["logprobs"] == a["logprobs"]
    assert b["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0
    # chat
    msgs = [{"role": "user", "content": "Tell me about Lily."}]
    ca = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 30, "temperature": 0}).json()
    content = ca["choices"][0]["message"]["content"]
    cb = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 30, "temperature": 0,
                                              "prediction": {"type": "content", "content": content}}).json()
    assert cb["choices"][0]["message"]["content"] == content
    m = s.metrics()
    assert m["wafer_spec_decode_num_drafts_total"] > 0
    assert 0 < m["wafer_spec_decode_num_accepted_tokens_total"] <= m["wafer_spec_decode_num_draft_tokens_total"]
    assert m['wafer_spec_decode_num_accepted_tokens_per_pos_total{position="0"}'] > 0
    assert m['wafer_spec_decode_num_accepted_tokens_per_pos_total{position="0"}'] >= \
        m['wafer_spec_decode_num_accepted_tokens_per_pos_total{position="1"}']


def test_prediction_default_server(stories_server):
    """On a server with the default (adaptive) speculation the answer is the same too."""
    c = stories_server.client
    req = {"prompt": "Lily went to the park and", "max_tokens": 40, "temperature": 0}
    text = c.post("/v1/completions", json=req).json()["choices"][0]["text"]
    r = c.post("/v1/completions", json=dict(req, prediction={"type": "content", "content": text}))
    assert r.json()["choices"][0]["text"] == text
    check_usage(r.json()["usage"], completion_tokens=40)


@pytest.mark.parametrize("body,param", [
    ({"prediction": {"type": "text", "content": "a"}}, "prediction.type"),
    ({"prediction": {"content": "a"}}, "prediction.type"),
    ({"prediction": "a"}, "prediction"),
    ({"prediction": {"type": "content", "content": 5}}, "prediction.content"),
    ({"prediction": {"type": "content", "content": [{"type": "image_url"}]}}, "prediction.content"),
    ({"prediction": {"type": "content", "content": "a"}, "n": 2}, "prediction"),
    ({"speculation": "draft"}, "speculation"),  # this server has no draft model
    ({"speculation": "medusa"}, "speculation"),
])
def test_prediction_refused(stories_server, body, param):
    r = stories_server.client.post("/v1/completions", json=dict({"prompt": "Once", "max_tokens": 4}, **body))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_draft_model_same_text(make_server, tmp_path):
    """A draft model (here the model drafting for itself, set in the YAML config) changes the speed, never the
    answer: greedy, seeded with logprobs, streamed; the usage counts its drafts (all accepted: the same model);
    a request may turn it off."""
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"server:\n  draft_model: {STORIES}\n  draft_fixed: true\n")
    s = make_server(STORIES, "--config", str(cfg))
    c = s.client
    req = {"prompt": "Lily went to the park and", "max_tokens": 40, "temperature": 0}
    plain = c.post("/v1/completions", json=dict(req, speculation="off")).json()
    assert plain["usage"]["completion_tokens_details"]["draft_tokens"] == 0
    r = c.post("/v1/completions", json=req).json()  # the server's default: the draft model
    assert r["choices"][0]["text"] == plain["choices"][0]["text"]
    d = r["usage"]["completion_tokens_details"]
    assert d["draft_tokens"] >= 20 and d["accepted_draft_tokens"] == d["draft_tokens"], d
    assert d["accepted_prediction_tokens"] == 0 and d["rejected_prediction_tokens"] == 0, d
    sreq = dict(req, temperature=0.9, seed=5, logprobs=2)
    a = c.post("/v1/completions", json=dict(sreq, speculation="off")).json()["choices"][0]
    b = c.post("/v1/completions", json=sreq).json()["choices"][0]
    assert b["text"] == a["text"] and b["logprobs"] == a["logprobs"]
    ev = sse_events(c.post("/v1/completions", json=dict(req, stream=True)))
    assert "".join(e["choices"][0]["text"] for e in ev[:-1]) == plain["choices"][0]["text"]
    assert s.metrics()["wafer_spec_decode_num_draft_tokens_total"] > 0


def test_draft_model_vocabulary_refused(tmp_path):
    """A draft model whose vocabulary is not the model's: the server does not start, and says why."""
    import subprocess
    from conftest import LLAMA19M, WAFER_BIN, need
    need(STORIES)
    need(LLAMA19M)
    p = subprocess.run([WAFER_BIN, "serve", "--model", LLAMA19M, "--draft-model", STORIES, "--port", "0",
                        "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert "another vocabulary (llama, 512 tokens)" in p.stderr and "(llama, 32000 tokens)" in p.stderr, p.stderr
