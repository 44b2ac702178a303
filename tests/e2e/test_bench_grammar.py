"""End-to-end checks of `wafer bench grammar`: it runs over the real 32k llama vocabulary, reports mask
times, and every constrained output it emits parses with Python's json module and validates with
python3-jsonschema (Draft 2020-12, formats checked) when that package is installed; user --schema and
--gbnf files work, and an unsupported keyword is refused by name."""
import json
import os
import subprocess

import pytest

WAFER = os.environ.get("WAFER_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "wafer"))
SHARED = os.environ.get("WAFER_SHARED", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared"))
VOCAB = os.path.join(SHARED, "tokenizer", "ggml-vocab-llama-spm.gguf")
need_vocab = pytest.mark.skipif(not os.path.exists(VOCAB), reason=f"{VOCAB} not found (set WAFER_SHARED)")


def wafer(*args, timeout=120):
    return subprocess.run([WAFER, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    if not os.path.exists(VOCAB):
        pytest.skip(f"{VOCAB} not found (set WAFER_SHARED)")
    out = tmp_path_factory.mktemp("bench") / "outputs.jsonl"
    r = wafer("bench", "grammar", "--model", VOCAB, "--runs", "4", "--tokens", "200", "--seed", "7", "--json",
              "--emit", str(out))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    return report, lines


def test_report(emitted):
    report, lines = emitted
    assert report["n_vocab"] == 32000
    names = [w["name"] for w in report["workloads"]]
    assert {"person", "tool-call", "recursive", "json_object", "gbnf-json"} <= set(names)
    for w in report["workloads"]:
        assert w["tokens"] > 0
        assert 0 <= w["mask_us_p50"] <= w["mask_us_p99"]
        assert w["valid"] == w["validated"]
    assert len(lines) == 4 * len(names)


def test_outputs_parse(emitted):
    _, lines = emitted
    finished = [l for l in lines if l["finished"] and l["kind"] != "gbnf"]
    assert len(finished) >= len(lines) // 2  # most runs end within 200 tokens
    for l in finished:
        json.loads(l["output"])  # Python's parser, independent of the engine's


def test_outputs_validate_with_jsonschema(emitted):
    try:
        import jsonschema
    except ImportError:
        pytest.skip("python3-jsonschema is not installed (apt install python3-jsonschema)")
    _, lines = emitted
    checked = 0
    for l in lines:
        if not l["finished"] or l["kind"] == "gbnf":
            continue
        schema = json.loads(l["schema"])
        jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER).validate(json.loads(l["output"]))
        checked += 1
    assert checked > 0


@need_vocab
def test_user_files(tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 7}},
                                  "required": ["n"], "additionalProperties": False}))
    gbnf = tmp_path / "g.gbnf"
    gbnf.write_text('root ::= "yes" | "no"\n')
    out = tmp_path / "o.jsonl"
    r = wafer("bench", "grammar", "--model", VOCAB, "--schema", str(schema), "--gbnf", str(gbnf), "--runs", "3",
              "--emit", str(out))
    assert r.returncode == 0, r.stderr
    assert "mask times in microseconds" in r.stdout
    for l in map(json.loads, out.read_text().splitlines()):
        assert l["finished"]
        if l["kind"] == "schema":
            v = json.loads(l["output"])
            assert 3 <= v["n"] <= 7 and list(v) == ["n"]
        else:
            assert l["output"] in ("yes", "no")


@need_vocab
def test_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "object", "properties": {"a": {"type": "string", "not": {}}}}')
    r = wafer("bench", "grammar", "--model", VOCAB, "--schema", str(bad))
    assert r.returncode == 1
    assert "unsupported keyword 'not' at /properties/a/not" in r.stderr
    broken = tmp_path / "bad.gbnf"
    broken.write_text('root ::= "a" |\n  ( "b"\n')
    r = wafer("bench", "grammar", "--model", VOCAB, "--gbnf", str(broken))
    assert r.returncode == 1
    assert "line 2, column 3: unclosed parenthesis" in r.stderr
    r = wafer("bench", "grammar")
    assert r.returncode == 2 and "--model is required" in r.stderr
    r = wafer("bench", "grammar", "--help")
    assert r.returncode == 0 and "usage: wafer bench grammar" in r.stdout
