"""Fixtures for the wafer serve end-to-end tests: start build/wafer serve on a free loopback port with a
model from the shared folder, wait until /ready says 200, stop it (SIGTERM) afterwards.

Environment: WAFER_BIN (absolute path of build/wafer), WAFER_SHARED (the shared folder with models/).
Tests skip, with the reason, only when the shared models are absent."""
import os
import re
import signal
import subprocess
import tempfile
import time

import httpx
import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WAFER_BIN = os.environ.get("WAFER_BIN") or os.path.join(REPO, "build", "wafer")
SHARED = os.environ.get("WAFER_SHARED") or os.path.abspath(os.path.join(REPO, "..", "shared"))
STORIES = os.path.join(SHARED, "models", "stories260K", "stories260K.gguf")
LLAMA19M = os.path.join(SHARED, "models", "llama-19M", "llama-19M-Q8_0.gguf")


def need(path):
    if not os.path.exists(path):
        pytest.skip(f"shared model {path} not found (set WAFER_SHARED)")
    if not os.path.exists(WAFER_BIN):
        pytest.skip(f"{WAFER_BIN} not built (run make)")
    return path


class Server:
    """One wafer serve process. Its stderr goes to a log file that tests may read."""

    def __init__(self, model, *args, wait_ready=True, timeout=30):
        self.log_file = tempfile.NamedTemporaryFile(prefix="wafer-serve-", suffix=".log", delete=False)
        self.log_path = self.log_file.name
        self.args = [WAFER_BIN, "serve", "--port", "0", "--threads", "1"]
        if model:
            self.args += ["--model", model]
        self.args += list(args)
        if "--data-dir" not in args and "--queue" not in args:
            # each server its own job store: one process per data dir, and tests must not touch ~/.local/share
            self.data_dir = tempfile.mkdtemp(prefix="wafer-jobs-")
            self.args += ["--data-dir", self.data_dir]
        self.proc = subprocess.Popen(self.args, stdout=self.log_file, stderr=subprocess.STDOUT)
        self.base = None
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(r"listening on (http://[\d.]+:\d+)", self.log())
            if m:
                self.base = m.group(1)
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"wafer serve exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.02)
        if not self.base:
            self.kill()
            raise RuntimeError("wafer serve did not start listening:\n" + self.log())
        if wait_ready:
            while time.time() < deadline:
                try:
                    if httpx.get(self.base + "/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if self.proc.poll() is not None:
                    raise RuntimeError(f"wafer serve exited with {self.proc.returncode}:\n{self.log()}")
                time.sleep(0.02)
            else:
                self.kill()
                raise RuntimeError("wafer serve never became ready:\n" + self.log())
        self.client = httpx.Client(base_url=self.base, timeout=60)

    def log(self):
        with open(self.log_path, "r", errors="replace") as f:
            return f.read()

    def url(self, path):
        return self.base + path

    def metrics(self):
        """Samples of /metrics as {name or name{labels}: value}."""
        text = httpx.get(self.base + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            key, val = line.rsplit(" ", 1)
            out[key] = float(val)
        return out

    def wait_metric(self, key, pred, timeout=10):
        deadline = time.time() + timeout
        val = None
        while time.time() < deadline:
            val = self.metrics().get(key)
            if val is not None and pred(val):
                return val
            time.sleep(0.02)
        raise AssertionError(f"metric {key} = {val} never satisfied the condition\n{self.log()[-3000:]}")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("wafer serve did not stop after the signal:\n" + self.log()[-3000:])
        try:
            self.client.close()
        except Exception:
            pass
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self):
        rc = self.stop()
        self.log_file.close()
        os.unlink(self.log_path)
        return rc


@pytest.fixture(scope="session")
def stories_server():
    """A shared server on stories260K (real tiny story model), chat via the chatml template."""
    need(STORIES)
    s = Server(STORIES, "--chat-template", "chatml", "--max-batch-size", "16", "--model-alias", "tiny",
               "--cors-origin", "https://app.example")
    yield s
    rc = s.close()
    assert rc == 0


@pytest.fixture(scope="session")
def slow_model(tmp_path_factory):
    """Path of a random llama written once per session by `wafer model new` for tests whose request must still
    be running when something happens to it (a deadline, a drain, a cancel, a kill): about 110 MB of Q8_0
    weights read per token, so one thread decodes about 360 tokens/s on a 2-vCPU Zen 5 (2.8 ms per token),
    14x slower than llama-19M (whose 0.2 ms per token left such windows a few times the test's own overhead,
    and a faster CI CPU closed them). llama-19M's tokenizer, a 4096-token context; the model's name is
    "slow-llama"."""
    need(LLAMA19M)
    path = str(tmp_path_factory.mktemp("slow-model") / "slow-llama.gguf")
    r = subprocess.run([WAFER_BIN, "model", "new", "--dim", "1024", "--layers", "6", "--heads", "16",
                        "--kv-heads", "4", "--ffn", "2816", "--ctx", "4096", "--type", "q8_0",
                        "--vocab-from", LLAMA19M, path], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return path


@pytest.fixture
def make_server():
    """Factory for servers with their own flags; every one is stopped at the end of the test."""
    made = []

    def make(model, *args, **kw):
        s = Server(need(model) if model else None, *args, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        try:
            s.stop()
        finally:
            s.kill()
            s.log_file.close()
            os.unlink(s.log_path)
