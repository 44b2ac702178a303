"""A `wafer serve` in models mode (docs/models.md) for the end-to-end tests: written config, free port, the
children it starts found through GET /admin/models, everything stopped (and checked gone) at the end."""
import os
import re
import signal
import subprocess
import tempfile
import time

import httpx

from conftest import WAFER_BIN


class ModelsServer:
    def __init__(self, tmp_path, yaml_text, *args, env=None, timeout=30, admin_key=None):
        self.cfg = os.path.join(str(tmp_path), "models-%d.yaml" % time.monotonic_ns())
        with open(self.cfg, "w") as f:
            f.write(yaml_text)
        self.admin_key = admin_key
        self.log_file = tempfile.NamedTemporaryFile(prefix="wafer-models-", suffix=".log", delete=False)
        self.log_path = self.log_file.name
        self.args = [WAFER_BIN, "serve", "--config", self.cfg, "--port", "0", "--threads", "1"] + list(args)
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen(self.args, stdout=self.log_file, stderr=subprocess.STDOUT, env=full_env)
        self.base = None
        self.pids = set()  # every child seen, checked gone at the end
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(r"models: listening on (http://[\d.]+:\d+)", self.log())
            if m:
                self.base = m.group(1)
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"wafer serve exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.02)
        if not self.base:
            self.proc.kill()
            raise RuntimeError("wafer serve (models) did not start listening:\n" + self.log())
        self.client = httpx.Client(base_url=self.base, timeout=60)

    def log(self):
        with open(self.log_path, "r", errors="replace") as f:
            return f.read()

    def headers(self, key=None):
        k = key or self.admin_key
        return {"Authorization": "Bearer " + k} if k else {}

    def admin_models(self, key=None):
        r = self.client.get("/admin/models", headers=self.headers(key))
        assert r.status_code == 200, r.text
        out = {m["name"]: m for m in r.json()["data"]}
        for m in out.values():
            if m["pid"]:
                self.pids.add(m["pid"])
        return out

    def states(self):
        return {m["id"]: m["state"] for m in self.client.get("/v1/models").json()["data"]}

    def wait_state(self, name, state, timeout=20):
        deadline = time.time() + timeout
        got = None
        while time.time() < deadline:
            got = self.admin_models()[name]["state"]
            if got == state:
                return
            time.sleep(0.05)
        raise AssertionError(f"model {name} is {got}, never {state}\n{self.log()[-4000:]}")

    def complete(self, model, prompt="Once upon a time", max_tokens=8, **kw):
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        body.update(kw)
        return self.client.post("/v1/completions", json=body)

    def metrics(self):
        out = {}
        for line in self.client.get("/metrics").text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            try:
                self.admin_models()
            except Exception:
                pass
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("wafer serve (models) did not stop on SIGTERM:\n" + self.log()[-3000:])
        self.client.close()
        # no child outlives the manager
        for pid in self.pids:
            assert not pid_alive(pid), f"child {pid} outlived the manager\n{self.log()[-3000:]}"
        return self.proc.returncode

    def close(self):
        try:
            return self.stop()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log_file.close()
            os.unlink(self.log_path)


def pid_alive(pid):
    """A process that exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
