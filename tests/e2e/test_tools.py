"""OpenAI tools on /v1/chat/completions, end to end on the random-weight llama-19M model (its free output is
noise, so every well-formed call is the grammar's work): tool_choice required / named / auto / none in each
tool format (Hermes on chatml, Llama 3, Mistral v3 and v7-tekken, the generic JSON form on zephyr), streamed
and not, parallel calls, a follow-up turn with the tool's result; every call's arguments validate against
its function's schema with python-jsonschema. Also logit_bias (completions and chat), and the 400s."""
import json

import jsonschema
import pytest

from conftest import LLAMA19M

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "days"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["tz"],
        "additionalProperties": False}
TREE = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                                          "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                                   "maxItems": 2}},
                           "required": ["v"], "additionalProperties": False}},
        "type": "object", "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": TIME}},
         {"type": "function", "function": {"name": "plant", "parameters": TREE}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
FAMILIES = ["chatml", "llama3", "mistral-v3", "mistral-v7-tekken", "zephyr"]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module", params=FAMILIES)
def server(request):
    from conftest import Server, need
    s = Server(need(LLAMA19M), "--chat-template", request.param, "--max-batch-size", "8", "--threads", "2", "--ctx-size", "2048")
    s.family = request.param
    yield s
    assert s.close() == 0


@pytest.fixture(scope="module")
def chatml():
    from conftest import Server, need
    s = Server(need(LLAMA19M), "--chat-template", "chatml", "--max-batch-size", "8", "--threads", "2", "--ctx-size", "2048")
    yield s
    assert s.close() == 0


def chat(server, **body):
    body.setdefault("messages", USER)
    body.setdefault("max_tokens", 200)
    return server.client.post("/v1/chat/completions", json=body)


def check_calls(msg, names=None):
    """The message's tool calls in OpenAI's shape, each one's arguments valid under its function's schema."""
    calls = msg["tool_calls"]
    assert calls, msg
    ids = set()
    for c in calls:
        assert c["type"] == "function" and isinstance(c["id"], str) and c["id"]
        ids.add(c["id"])
        name = c["function"]["name"]
        assert name in (names or SCHEMAS), c
        args = json.loads(c["function"]["arguments"])
        jsonschema.validate(args, SCHEMAS[name])
    assert len(ids) == len(calls)
    return calls


def test_required_and_named(server):
    done = 0
    for seed in range(3):
        # parallel calls on chatml only: in the JSON-array forms the random model keeps adding calls
        r = chat(server, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed,
                 parallel_tool_calls=server.family == "chatml")
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        if ch["finish_reason"] == "length":  # parallel calls may go on past max_tokens: never claimed complete
            assert "tool_calls" not in ch["message"]
            continue
        done += 1
        assert ch["finish_reason"] == "tool_calls", ch
        check_calls(ch["message"])
        if server.family == "mistral-v3":
            assert all(len(c["id"]) == 9 for c in ch["message"]["tool_calls"])  # the model's own ids
    for seed in range(3):
        r = chat(server, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
                 temperature=1.0, seed=seed, parallel_tool_calls=False)
        ch = r.json()["choices"][0]
        assert ch["finish_reason"] == "tool_calls", ch
        assert len(check_calls(ch["message"], names={"get_time"})) == 1
    assert done > 0


def test_auto_and_none(server):
    kinds = set()
    for seed in range(10):
        r = chat(server, tools=TOOLS, temperature=1.0, seed=seed, max_tokens=60)  # auto is the default with tools
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        msg = ch["message"]
        if ch["finish_reason"] == "tool_calls":
            check_calls(msg)
            kinds.add("calls")
        else:
            assert ch["finish_reason"] in ("stop", "length") and "tool_calls" not in msg
            assert isinstance(msg["content"], str)
            if server.family == "chatml":
                assert not msg["content"].startswith("<tool_call>")
            kinds.add("text")
            text_seed = seed
    if server.family == "zephyr":  # the generic form's choice is a JSON key: both come up
        assert kinds == {"calls", "text"}, kinds
    if server.family in ("chatml", "mistral-v3", "llama3"):
        # an auto answer that shows it is text streams token by token, as without tools
        body = dict(tools=TOOLS, temperature=1.0, seed=text_seed, max_tokens=30, messages=USER)
        want = chat(server, **body).json()["choices"][0]["message"]["content"]
        deltas = []
        with server.client.stream("POST", "/v1/chat/completions", json=dict(body, stream=True)) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    for ch in json.loads(line[6:])["choices"]:
                        if ch["delta"].get("content"):
                            deltas.append(ch["delta"]["content"])
        assert "".join(deltas) == want and len(deltas) > 3, deltas
    r = chat(server, tools=TOOLS, tool_choice="none", temperature=1.0, seed=1, max_tokens=20)
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] in ("stop", "length") and "tool_calls" not in ch["message"], ch


def test_stream_matches_non_stream(server):
    """The same seeded request streamed: the tool_calls deltas assemble to the non-streamed calls (several
    for some seeds), or the same text when it ran out of tokens."""
    n_calls = []
    for seed in (7, 8):
        body = dict(tools=TOOLS[:2], tool_choice="required", temperature=1.0, seed=seed, messages=USER, max_tokens=250,
                    parallel_tool_calls=server.family == "chatml")
        full = chat(server, **body).json()["choices"][0]
        calls, finish, role, text = {}, None, None, ""
        with server.client.stream("POST", "/v1/chat/completions", json=dict(body, stream=True)) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                assert "error" not in ev, ev
                for ch in ev["choices"]:
                    d = ch["delta"]
                    role = d.get("role", role)
                    text += d.get("content") or ""
                    for tc in d.get("tool_calls", []):
                        c = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
                        c["id"] = tc.get("id") or c["id"]
                        c["name"] += tc.get("function", {}).get("name", "")
                        c["arguments"] += tc.get("function", {}).get("arguments", "")
                    finish = ch["finish_reason"] or finish
        assert role == "assistant" and finish == full["finish_reason"]
        if finish == "length":
            assert text == full["message"]["content"] and not calls
            continue
        assert finish == "tool_calls" and text == ""
        got = [{"name": calls[i]["name"], "arguments": calls[i]["arguments"]} for i in sorted(calls)]
        want = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                for c in full["message"]["tool_calls"]]
        assert got == want
        assert all(calls[i]["id"] for i in calls)
        n_calls.append(len(got))
    assert n_calls, "every seed ran out of tokens"


def test_parallel_calls(chatml):
    counts = set()
    for seed in range(12):
        r = chat(chatml, tools=TOOLS[:2], tool_choice="required", temperature=1.0, seed=seed)
        ch = r.json()["choices"][0]
        if ch["finish_reason"] == "length":
            continue
        counts.add(len(check_calls(ch["message"])))
        r = chat(chatml, tools=TOOLS[:2], tool_choice="required", temperature=1.0, seed=seed,
                 parallel_tool_calls=False)
        assert len(check_calls(r.json()["choices"][0]["message"])) == 1
    assert max(counts) > 1, counts  # the random model stops after one call or goes on: both happen


def test_follow_up_with_tool_result(server):
    first = chat(server, tools=TOOLS[:2], tool_choice="required", temperature=0.0,
                 parallel_tool_calls=False).json()["choices"][0]
    msg = first["message"]
    call = msg["tool_calls"][0]
    follow = USER + [msg, {"role": "tool", "tool_call_id": call["id"], "content": "18 degrees and sunny"}]
    r = chat(server, messages=follow, tools=TOOLS[:2], tool_choice="auto", temperature=0.0, max_tokens=30)
    assert r.status_code == 200, r.text
    # the call and its result are in the prompt: it is longer than the first turn's by at least their text
    grew = r.json()["usage"]["prompt_tokens"] - chat(server, tools=TOOLS[:2], max_tokens=1).json()["usage"]["prompt_tokens"]
    assert grew > 10, grew
    # without tools the turn is still rendered (a client may drop them after the call)
    r = chat(server, messages=follow, max_tokens=5)
    assert r.status_code == 200, r.text
    # a tool message must say which call it answers
    r = chat(server, messages=USER + [{"role": "tool", "content": "x"}])
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[1].tool_call_id"


def test_bad_tools_are_400(chatml):
    def err(**body):
        r = chat(chatml, **body)
        assert r.status_code == 400, r.text
        return r.json()["error"]

    e = err(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e["param"] == "tool_choice.function.name" and "nope" in e["message"]
    assert err(tools=TOOLS, tool_choice="sometimes")["param"] == "tool_choice"
    assert err(tool_choice="required")["param"] == "tool_choice"
    assert err(tools={"a": 1})["param"] == "tools"
    assert err(tools=[{"type": "function"}])["param"] == "tools[0]"
    assert err(tools=[{"type": "retrieval", "function": {"name": "a"}}])["param"] == "tools[0]"
    assert err(tools=[{"type": "function", "function": {"name": "bad name"}}])["param"] == "tools[0].function.name"
    assert err(tools=[TOOLS[0], TOOLS[0]])["param"] == "tools[1].function.name"
    assert err(tools=[{"type": "function", "function": {"name": "a", "parameters": []}}])["param"] == \
        "tools[0].function.parameters"
    e = err(tools=[TOOLS[0], {"type": "function", "function": {"name": "b", "parameters": {
        "type": "object", "properties": {"x": {"not": {"type": "string"}}}}}}], tool_choice="required")
    assert e["param"] == "tools[1].function.parameters" and "'not'" in e["message"], e
    assert err(tools=TOOLS, response_format={"type": "json_object"})["param"] == "response_format"
    assert err(messages=USER + [{"role": "assistant", "tool_calls": [{"type": "function"}]}])["param"] == \
        "messages[1].tool_calls[0]"
    r = chatml.client.post("/v1/completions", json={"prompt": "x", "tools": TOOLS})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    r = chatml.client.post("/v1/chat/completions", json={"messages": USER, "functions": [{"name": "a"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "functions"


def test_logit_bias(chatml):
    c = chatml.client

    def complete(**body):
        body.setdefault("prompt", "Once upon a time")
        body.setdefault("max_tokens", 6)
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]

    piece = c.post("/detokenize", json={"tokens": [4804]}).json()["content"]  # "call"
    for temp in (0.0, 1.0):
        got = complete(temperature=temp, seed=3, logit_bias={"4804": 100})
        assert got["text"] == piece * 6, got
    def first_token(**body):
        with c.stream("POST", "/v1/completions", json=dict(prompt="Once upon a time", max_tokens=3, temperature=0.0,
                                                         stream=True, return_token_ids=True, **body)) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    ids = json.loads(line[6:])["choices"][0].get("token_ids")
                    if ids:
                        return ids[0]
    greedy = complete(temperature=0.0)
    first_id = first_token()
    assert first_token(logit_bias={str(first_id): -100}) != first_id
    assert complete(temperature=0.0, logit_bias={str(first_id): 0})["text"] == greedy["text"]
    r = c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 4, "temperature": 0,
                                             "logit_bias": {"4804": 100}})
    assert r.json()["choices"][0]["message"]["content"] == piece * 4
    # with a grammar the bias cannot lift a forbidden token: the answer is still valid JSON
    r = c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 60, "temperature": 0,
                                             "logit_bias": {"4804": 100}, "response_format": {"type": "json_object"}})
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "length" or isinstance(json.loads(ch["message"]["content"]), dict)
    for bad in ({"4804": 101}, {"4804": -100.5}, {"abc": 1}, {"-1": 1}, {"99999999": 1}, {"4804": "1"}, [1]):
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "logit_bias": bad})
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["param"] == "logit_bias"
