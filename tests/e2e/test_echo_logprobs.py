"""echo with logprobs on /v1/completions (OpenAI's legacy shape): the text starts with the prompt, and the
logprobs cover the prompt's tokens (the first one null) and then the generated ones, with offsets into the
text. Each prompt token's logprob is the one the model gives that token when it generates it."""
import pytest

from conftest import LLAMA19M


@pytest.fixture(scope="module")
def server():
    from conftest import Server, need
    s = Server(need(LLAMA19M), "--threads", "2", "--max-batch-size", "4")
    yield s
    assert s.close() == 0


def complete(server, **body):
    r = server.client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_echo_logprobs_shape(server):
    prompt = "Once upon a time"
    out = complete(server, prompt=prompt, max_tokens=3, echo=True, logprobs=2, temperature=0)
    ch = out["choices"][0]
    lp = ch["logprobs"]
    n_prompt = out["usage"]["prompt_tokens"]
    assert ch["text"].startswith(prompt)
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert len(lp["tokens"]) == n_prompt + out["usage"]["completion_tokens"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(isinstance(x, float) and x <= 0 for x in lp["token_logprobs"][1:])
    assert all(len(t) == 2 for t in lp["top_logprobs"][1:])
    # offsets (bytes, as wafer's logprobs count them) point into the text: each generated token's piece
    # starts where its offset says, the prompt's pieces too (but the first's SentencePiece space)
    text = ch["text"].encode()
    for k, (tok, off) in enumerate(zip(lp["tokens"], lp["text_offset"])):
        piece = tok.encode()[1:] if k == 1 else tok.encode()
        assert text[off:off + len(piece)] == piece, (k, tok, off)
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][n_prompt] == len(prompt)
    # the same again (its prompt is now in the prefix cache, which scoring does not use) and with n=2
    again = complete(server, prompt=prompt, max_tokens=3, echo=True, logprobs=2, temperature=0)
    assert again["choices"][0]["logprobs"] == lp
    two = complete(server, prompt=prompt, max_tokens=3, echo=True, logprobs=2, temperature=0, n=2)
    for c in two["choices"]:
        assert c["logprobs"]["token_logprobs"][:n_prompt] == lp["token_logprobs"][:n_prompt]
    # without logprobs echo is text only
    plain = complete(server, prompt=prompt, max_tokens=3, echo=True, temperature=0)
    assert plain["choices"][0]["logprobs"] is None and plain["choices"][0]["text"] == ch["text"]


def test_prompt_logprobs_match_generation(server):
    """Greedy tokens and their logprobs, then the same tokens as a prompt: the scores agree."""
    start = server.client.post("/tokenize", json={"content": "The little dog"}).json()["tokens"]
    gen = []
    with server.client.stream("POST", "/v1/completions", json={
            "prompt": start, "max_tokens": 8, "temperature": 0, "logprobs": 0, "stream": True,
            "return_token_ids": True}) as r:
        import json
        for line in r.iter_lines():
            if line.startswith("data: {"):
                c = json.loads(line[6:])["choices"][0]
                ids = c.get("token_ids") or []
                lps = (c.get("logprobs") or {}).get("token_logprobs") or []
                gen += list(zip(ids, lps))
    assert len(gen) == 8
    out = complete(server, prompt=start + [t for t, _ in gen], max_tokens=1, echo=True, logprobs=0, temperature=0)
    scored = out["choices"][0]["logprobs"]["token_logprobs"][len(start):len(start) + 8]
    for (tok, want), got in zip(gen, scored):
        assert got == pytest.approx(want, abs=2e-3), (tok, want, got)


def test_logprobs_format_chat(server):
    """logprobs_format "chat" (wafer route's continuation of a chat stream): the same tokens and logprobs in
    chat's shape, streaming and not; a bad value or echo with it is a 400."""
    body = dict(prompt="Once upon a time", max_tokens=4, logprobs=2, temperature=0)
    plain = complete(server, **body)["choices"][0]["logprobs"]
    chat = complete(server, **body, logprobs_format="chat")["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in chat] == plain["tokens"]
    assert [e["logprob"] for e in chat] == plain["token_logprobs"]
    assert [[t["token"] for t in e["top_logprobs"]] for e in chat] == [list(t) for t in plain["top_logprobs"]]
    assert all(bytes(e["bytes"]).decode() == e["token"] for e in chat)
    import json
    with server.client.stream("POST", "/v1/completions", json={**body, "stream": True, "logprobs_format": "chat"}) as s:
        events = [json.loads(l[6:]) for l in s.read().decode().split("\n\n") if l.startswith("data: {")]
    streamed = [e for o in events for c in o["choices"] if c["logprobs"] for e in c["logprobs"]["content"]]
    assert streamed == chat
    for bad, param in (({"logprobs_format": "xml"}, "logprobs_format"), ({"logprobs_format": "chat", "echo": True}, "logprobs_format")):
        r = server.client.post("/v1/completions", json={**body, **bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
