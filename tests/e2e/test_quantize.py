"""End-to-end checks of `wafer quantize` as a user runs it: exit codes, progress on stderr, a readable output."""
import os
import struct
import subprocess

import pytest

WAFER = os.environ.get("WAFER_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "wafer"))
SHARED = os.environ.get("WAFER_SHARED", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared"))
STORIES = os.path.join(SHARED, "models", "stories260K", "stories260K.gguf")


def run(*args):
    return subprocess.run([WAFER, "quantize", *args], capture_output=True, text=True, timeout=120)


def header(path):
    with open(path, "rb") as f:
        magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
    return magic, version, n_tensors, n_kv


@pytest.mark.skipif(not os.path.exists(STORIES), reason=f"shared model {STORIES} not found (set WAFER_SHARED)")
def test_quantize_stories_q8_0(tmp_path):
    out = tmp_path / "s-q8_0.gguf"
    r = run(STORIES, str(out), "q8_0")
    assert r.returncode == 0, r.stderr
    assert "[ 1/48] token_embd.weight" in r.stderr
    assert "[48/48] blk.4.ffn_norm.weight" in r.stderr
    # ffn_down rows of 172 do not divide into q8_0 blocks: warned and kept in f16
    assert "blk.0.ffn_down.weight: rows of 172 elements do not divide into q8_0 blocks of 32; using f16" in r.stderr
    magic, version, n_tensors, n_kv = header(out)
    assert (magic, version, n_tensors) == (b"GGUF", 3, 48)
    src = header(STORIES)
    assert n_kv == src[3] + 2  # + general.file_type and general.quantization_version
    assert out.stat().st_size < os.path.getsize(STORIES) / 2


def test_quantize_usage_errors(tmp_path):
    r = run("--help")
    assert r.returncode == 0 and "usage: wafer quantize" in r.stdout
    r = run("a.gguf", "b.gguf")
    assert r.returncode == 2 and "expected IN.gguf OUT.gguf TYPE" in r.stderr
    r = run("a.gguf", "b.gguf", "q2_k")
    assert r.returncode == 2 and "unknown TYPE 'q2_k'" in r.stderr
    out = tmp_path / "never.gguf"
    r = run(str(tmp_path / "missing.gguf"), str(out), "q4_0")
    assert r.returncode == 1 and "missing.gguf: cannot open: No such file or directory" in r.stderr
    assert not out.exists()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<I", 1) + bytes(16))
    r = run(str(bad), str(out), "q4_0")
    assert r.returncode == 1 and "GGUF version 1 (offset 4) is not supported" in r.stderr
    assert not out.exists()
