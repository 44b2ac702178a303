"""Structured output end to end on the random-weight llama-19M model (its free output is noise, so every valid
answer is the constraint's work): response_format json_schema / json_object, llama.cpp's grammar and
json_schema fields, on chat and completions, streamed and not; every answer that finishes "stop" parses and
validates with python-jsonschema; malformed or unsupported schemas and grammars are 400 naming the position
or the keyword; the official openai npm client's chat.completions.parse."""
import concurrent.futures
import json
import os
import re
import subprocess

import jsonschema
import pytest

from conftest import LLAMA19M
from test_serve_openai_node import NODE_DIR, ensure_client

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 130}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 5},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 6}},
     "required": ["ok", "note"]},
    {"enum": ["red", "green", "blue", 7, None]},
    {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"},
                                      "day": {"type": "string", "format": "date"}}, "required": ["id", "day"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}},
     "required": ["code"], "additionalProperties": False},
    {"anyOf": [{"type": "integer", "minimum": 10, "maximum": 20}, {"type": "string", "minLength": 2, "maxLength": 4}]},
    {"type": "object", "properties": {"p": {"type": "array", "prefixItems": [{"type": "integer"}, {"const": "x"}],
                                            "items": False}}, "required": ["p"]},
    {"$defs": {"t": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                                     "c": {"type": "array", "items": {"$ref": "#/$defs/t"}, "maxItems": 2}},
                     "required": ["v"], "additionalProperties": False}},
     "$ref": "#/$defs/t"},
    {"type": "object", "properties": {"when": {"type": "string", "format": "time"},
                                      "n": {"type": "number"}}, "required": ["when", "n"], "additionalProperties": False},
]

FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


@pytest.fixture(scope="module")
def server(request):
    from conftest import Server, need
    s = Server(need(LLAMA19M), "--chat-template", "chatml", "--max-batch-size", "16", "--threads", "2")
    yield s
    assert s.close() == 0


def check(schema, text):
    value = json.loads(text)
    jsonschema.validate(value, schema, format_checker=FORMATS)
    return value


def chat(server, body):
    return server.client.post("/v1/chat/completions", json=body)


def test_hundred_requests_ten_schemas(server):
    def one(i):
        schema = SCHEMAS[i % len(SCHEMAS)]
        body = {"messages": [{"role": "user", "content": f"json {i}"}], "max_tokens": 200, "temperature": 1.0,
                "seed": i, "response_format": {"type": "json_schema",
                                               "json_schema": {"name": f"s{i % 10}", "schema": schema}}}
        r = chat(server, body)
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        return schema, ch["message"]["content"], ch["finish_reason"]
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        results = list(ex.map(one, range(100)))
    n_stop = 0
    for schema, text, finish in results:
        if finish == "stop":
            check(schema, text)
            n_stop += 1
        else:
            assert finish == "length"
    assert n_stop >= 95, n_stop


def test_completions_json_object_n_and_stream(server):
    r = server.client.post("/v1/completions", json={"prompt": "{", "max_tokens": 300, "n": 3, "temperature": 1.0,
                                                    "seed": 5, "response_format": {"type": "json_object"}})
    assert r.status_code == 200, r.text
    for ch in r.json()["choices"]:
        if ch["finish_reason"] == "stop":
            assert isinstance(json.loads(ch["text"]), dict)
    schema = SCHEMAS[0]
    with server.client.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, "stream": True, "seed": 3,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": True}}}) as s:
        text, finish = "", None
        for line in s.iter_lines():
            line = line.strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                for ch in json.loads(line[6:])["choices"]:
                    text += ch["delta"].get("content") or ""
                    finish = ch["finish_reason"] or finish
    assert finish == "stop"
    check(schema, text)


def test_greedy_deterministic(server):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 200, "temperature": 0,
            "json_schema": SCHEMAS[2]}
    a, b = chat(server, body).json(), chat(server, body).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    check(SCHEMAS[2], a["choices"][0]["message"]["content"])


def test_recursive_schema_and_pattern(server):
    for schema in (SCHEMAS[8], SCHEMAS[5]):
        for seed in range(5):
            r = server.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 250, "temperature": 1.0,
                                                            "seed": seed, "json_schema": schema})
            assert r.status_code == 200, r.text
            ch = r.json()["choices"][0]
            if ch["finish_reason"] == "stop":
                check(schema, ch["text"])
    for seed in range(5):
        r = server.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 60, "seed": seed,
                                                        "json_schema": SCHEMAS[5]})
        assert re.fullmatch(r'\s*\{\s*"code"\s*:\s*"[A-Z]{2}[0-9]{3}"\s*\}\s*', r.json()["choices"][0]["text"])


ARITH = r'''
root ::= expr
expr ::= term (ws ("+" | "-" | "*") ws term){0,4}
term ::= [1-9] [0-9]{0,2} | "(" expr ")"
ws ::= " "?
'''


def test_gbnf_arithmetic(server):
    for seed in range(6):
        r = server.client.post("/v1/completions", json={"prompt": "1+1=", "max_tokens": 120, "temperature": 1.0,
                                                        "seed": seed, "grammar": ARITH})
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        if ch["finish_reason"] != "stop":
            continue
        expr = ch["text"]
        assert re.fullmatch(r"[0-9+\-* ()]+", expr), expr
        assert expr.count("(") == expr.count(")")
        eval(expr, {"__builtins__": {}})  # a well-formed arithmetic expression


def test_bad_schemas_and_grammars_are_400(server):
    def err(body):
        r = server.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 8, **body})
        assert r.status_code == 400, r.text
        return r.json()["error"]
    e = err({"response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}}}})
    assert e["param"] == "response_format" and "'not'" in e["message"] and "/properties/a/not" in e["message"]
    e = err({"grammar": "root ::= \"a\" | \nfoo ::= [a-"})
    assert e["param"] == "grammar" and re.search(r"line \d+, column \d+", e["message"]), e
    e = err({"grammar": "root ::= undefined_rule"})
    assert "undefined_rule" in e["message"]
    e = err({"json_schema": {"type": "string", "pattern": "(a)\\1"}})
    assert e["param"] == "json_schema"
    e = err({"response_format": {"type": "xml"}})
    assert e["param"] == "response_format.type"
    e = err({"grammar": "root ::= \"a\"", "json_schema": {"type": "string"}})
    assert "only one" in e["message"]
    r = server.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 8,
                                                    "response_format": {"type": "text"}})
    assert r.status_code == 200


def test_budget_too_small_is_length(server):
    schema = {"type": "string", "minLength": 50, "maxLength": 60}
    r = server.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "json_schema": schema})
    assert r.status_code == 200
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_stop_string_that_cuts_json_is_an_error(server):
    r = server.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 100, "stop": ["\"age\""],
                                                    "json_schema": SCHEMAS[0]})
    assert r.status_code == 500, r.text
    assert "validation" in r.json()["error"]["message"]


def test_openai_npm_client_parse(server):
    ensure_client()
    p = subprocess.run(["node", "structured_client.mjs", server.base], cwd=NODE_DIR, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "population": {"type": "integer", "minimum": 0, "maximum": 99999}},
              "required": ["city", "population"], "additionalProperties": False}
    jsonschema.validate(out["parsed"], schema)
    jsonschema.validate(out["streamed"], schema)
    jsonschema.validate(out["zod_parsed"], schema)
    jsonschema.validate(out["tool_arguments"], {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False})
    jsonschema.validate(out["zod_tool_arguments"], {
        "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                         "tag": {"enum": ["a", "b"]}}, "required": ["id", "tag"]})
