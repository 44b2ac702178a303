"""The official openai npm client (v5) drives wafer serve unchanged: completions, chat completions and
streaming of both (tests/e2e/node/openai_client.mjs). Installs the client with npm when node_modules is
missing; skips with the reason when node or npm is not installed or the registry cannot be reached."""
import json
import os
import shutil
import subprocess

import pytest

NODE_DIR = os.path.join(os.path.dirname(__file__), "node")


def ensure_client():
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node/npm not installed")
    if all(os.path.isdir(os.path.join(NODE_DIR, "node_modules", m)) for m in ("openai", "zod")):
        return
    cmd = ["npm", "ci"] if os.path.exists(os.path.join(NODE_DIR, "package-lock.json")) else ["npm", "install"]
    p = subprocess.run(cmd + ["--no-audit", "--no-fund"], cwd=NODE_DIR, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        pytest.skip(f"cannot install the openai npm client ({' '.join(cmd)} failed): {p.stderr[-500:]}")


def test_openai_node_client(stories_server):
    ensure_client()
    p = subprocess.run(["node", "openai_client.mjs", stories_server.base], cwd=NODE_DIR, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["models"] == ["stories260K", "tiny"]
    assert out["completion"] == out["completion_stream"] and len(out["completion"]) > 10
    assert out["chat"] == out["chat_stream"]
    assert out["error_status"] == 404 and out["error_code"] == "model_not_found"
    assert out["bad_param"] == "max_tokens"
