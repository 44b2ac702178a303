"""End-to-end tests of `wafer route` across processes: a result cache shared in a real redis-server by two
routers, and a pool given by a host name whose addresses change while the router runs (the router runs in
its own mount namespace with a private /etc/hosts that the test edits)."""
import os
import re
import signal
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from route_standin import Standin, generate, text_of
from test_route import Router, one_pool, stream_events, stream_text, router, standin  # noqa: F401 (fixtures)


def free_port(host="127.0.0.1"):
    s = socket.socket()
    s.bind((host, 0))
    p = s.getsockname()[1]
    s.close()
    return p


class RedisServer:
    """A real redis-server on a free loopback port, no persistence; can be killed, paused and restarted."""

    def __init__(self, port=None):
        exe = shutil.which("redis-server")
        if not exe:
            pytest.skip("redis-server is not installed (make deps installs it)")
        self.exe = exe
        self.dir = tempfile.mkdtemp(prefix="wafer-route-redis-")
        self.port = port or free_port()
        self.start()

    def start(self):
        self.proc = subprocess.Popen([self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.dir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start on port %d" % self.port)

    def keys(self, pattern="*"):
        out = subprocess.run(["redis-cli", "-p", str(self.port), "--raw", "KEYS", pattern], capture_output=True,
                             text=True, timeout=10).stdout
        return [k for k in out.split("\n") if k]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def redis_server():
    made = []

    def make(*a, **kw):
        r = RedisServer(*a, **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.kill()
        shutil.rmtree(r.dir, ignore_errors=True)


def post(r, body, **kw):
    return r.client.post("/v1/completions", json=body, **kw)


def test_redis_cache_is_shared_between_two_routers(standin, router, redis_server):
    red = redis_server()
    s = standin()
    conf = one_pool([s.url], "cache: {url: 'redis://127.0.0.1:%d', ttl_s: 1.5}\n" % red.port)
    r1, r2 = router(conf), router(conf)
    body = {"model": "m", "prompt": "share me", "max_tokens": 5, "temperature": 0}
    first = post(r1, body)
    assert first.status_code == 200 and first.headers["x-wafer-cache"] == "miss"
    deadline = time.time() + 5  # the store goes to Redis after the answer
    while not red.keys("wafer:route:cache:*"):
        assert time.time() < deadline, "the entry never reached Redis:\n" + r1.log()[-2000:]
        time.sleep(0.01)
    # the other router serves it from Redis, as it was and as a stream; the backend generated once
    second = post(r2, body)
    assert second.headers["x-wafer-cache"] == "hit", r2.log()[-2000:]
    assert second.json() == first.json()
    ev, headers = stream_events(r2, "/v1/completions", {**body, "stream": True})
    assert headers["x-wafer-cache"] == "hit" and stream_text(ev) == text_of(generate(list(b"share me"), 5))
    assert s.generations() == 1
    # a streamed miss on r2 is stored too, and r1 finds it
    other = {**body, "prompt": "other"}
    ev, headers = stream_events(r2, "/v1/completions", {**other, "stream": True})
    assert headers["x-wafer-cache"] == "miss"
    deadline = time.time() + 5
    while len(red.keys("wafer:route:cache:*")) < 2:
        assert time.time() < deadline
        time.sleep(0.01)
    assert post(r1, other).headers["x-wafer-cache"] == "hit", r1.log()[-3000:]
    assert s.generations() == 2
    # the TTL is Redis's: after it, a miss everywhere
    time.sleep(1.6)
    assert red.keys("wafer:route:cache:*") == []
    assert post(r2, body).headers["x-wafer-cache"] == "miss"
    assert s.generations() == 3
    m = r2.metrics()
    assert m['wafer_route_cache_total{result="hit"}'] == 2 and m["wafer_route_cache_redis_up"] == 1


def test_redis_down_or_hung_bypasses_the_cache(standin, router, redis_server):
    red = redis_server()
    s = standin()
    r = router(one_pool([s.url], "cache: {url: 'redis://127.0.0.1:%d', ttl_s: 60, timeout_ms: 200}\n" % red.port))
    body = {"model": "m", "prompt": "keep", "max_tokens": 3, "temperature": 0}
    assert post(r, body).headers["x-wafer-cache"] == "miss"
    deadline = time.time() + 5
    while post(r, body).headers["x-wafer-cache"] != "hit":
        assert time.time() < deadline
        time.sleep(0.02)
    # hung (SIGSTOP): a lookup gets no answer within timeout_ms; the request is served by the backend
    red.proc.send_signal(signal.SIGSTOP)
    t0 = time.time()
    got = post(r, body)
    assert got.status_code == 200 and got.headers["x-wafer-cache"] == "bypass"
    assert time.time() - t0 < 3
    assert "no answer within 200 ms" in r.log()
    # while it is known to be down, requests do not even wait for it
    t0 = time.time()
    for _ in range(5):
        assert post(r, body).headers["x-wafer-cache"] == "bypass"
    assert time.time() - t0 < 2
    red.proc.send_signal(signal.SIGCONT)
    # back: the router reconnects by itself (every second) and the entry is still there
    deadline = time.time() + 10
    while post(r, body).headers["x-wafer-cache"] != "hit":
        assert time.time() < deadline, r.log()[-2000:]
        time.sleep(0.1)
    assert "is back" in r.log()
    # down (kill -9): bypassed with one log line, every request still answered, no crash
    n = r.log().count("is unavailable")
    red.kill()
    for i in range(10):
        got = post(r, {**body, "prompt": "down %d" % i})
        assert got.status_code == 200 and got.headers["x-wafer-cache"] == "bypass"
        assert got.json()["choices"][0]["text"] == text_of(generate(list(b"down %d" % i), 3))
    assert r.log().count("is unavailable") == n + 1, r.log()[-2000:]
    m = r.metrics()
    assert m["wafer_route_cache_redis_up"] == 0 and m['wafer_route_cache_total{result="unavailable"}'] >= 10
    assert re.search(r"status=200 backends=\S+\(200\) .* cache=bypass [\d.]+ ms$", r.log().strip().splitlines()[-1])
    # a new redis-server on the same port: the cache works again (empty now)
    red.start()
    deadline = time.time() + 10
    while post(r, body).headers["x-wafer-cache"] != "miss":
        assert time.time() < deadline, r.log()[-2000:]
        time.sleep(0.1)
    deadline = time.time() + 5
    while post(r, body).headers["x-wafer-cache"] != "hit":
        assert time.time() < deadline
        time.sleep(0.02)


def test_redis_url_is_checked(tmp_path):
    from conftest import WAFER_BIN
    cfg = tmp_path / "r.yaml"
    cfg.write_text("pools:\n  - {name: p, backends: [http://127.0.0.1:9]}\nroutes:\n  - {model: '*', pool: p}\n"
                   "cache:\n  url: 'http://127.0.0.1:6379'\n")
    out = subprocess.run([WAFER_BIN, "route", "--config", str(cfg)], capture_output=True, text=True, timeout=20)
    assert out.returncode != 0
    assert re.search(r"r\.yaml:6: cache\.url: 'http://127.0.0.1:6379': expected redis://", out.stderr + out.stdout), \
        out.stderr + out.stdout


# ---- a pool that is a host name (DNS round robin, a Kubernetes headless service) ------------------------


def _private_hosts_ok():
    """Whether a process may get its own /etc/hosts (a mount namespace with a bind mount: root, or
    CAP_SYS_ADMIN); the reason when not."""
    if not shutil.which("unshare"):
        return "unshare (util-linux) is not installed"
    with tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False) as f:
        f.write("127.0.0.9 probe.wafer.test\n")
    try:
        out = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                              'mount --bind "$0" /etc/hosts && cat /etc/hosts', f.name],
                             capture_output=True, text=True, timeout=10)
        if "probe.wafer.test" not in out.stdout:
            return "cannot bind-mount a private /etc/hosts in a mount namespace (needs root): " + out.stderr.strip()
        return None
    finally:
        os.unlink(f.name)


def test_a_host_name_pool_grows_and_shrinks_with_its_addresses(router):
    why = _private_hosts_ok()
    if why:
        pytest.skip(why)
    # backends on 127.0.0.2..4, all on the same port: one name, several addresses
    port = free_port("127.0.0.2")
    backs = {}
    try:
        for a in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
            backs[a] = Standin(host=a, port=port)
    except OSError as e:
        for s in backs.values():
            s.close()
        pytest.skip("cannot bind 127.0.0.x:%d: %s" % (port, e))
    hosts = tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False)
    hosts.close()

    def set_hosts(addrs):
        with open(hosts.name, "w") as f:  # in place: the bind mount follows the inode
            f.write("127.0.0.1 localhost\n" + "".join("%s pool.wafer.test\n" % a for a in addrs))

    def members(r):
        text = r.client.get("/metrics").text
        # a backend that left the pool stays in the metrics (its counters), with up 0
        return set(re.findall(r'wafer_route_backend_up\{backend="pool\.wafer\.test:%d/([\d.]+):%d"\} 1' % (port, port),
                              text))

    def wait_members(r, want):
        deadline = time.time() + 10
        while members(r) != want:
            assert time.time() < deadline, (members(r), want, r.log()[-2000:])
            time.sleep(0.05)

    def spread(r, n=30):
        before = {a: s.generations() for a, s in backs.items()}
        for i in range(n):
            got = r.client.post("/v1/completions", json={"model": "m", "prompt": "x%d" % i, "max_tokens": 1})
            assert got.status_code == 200, got.text
        return {a: backs[a].generations() - before[a] for a in backs}

    try:
        set_hosts(["127.0.0.2", "127.0.0.3"])
        wrap = ("unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                'mount --bind "$0" /etc/hosts && exec "$@"', hosts.name)
        r = router(one_pool(["http://pool.wafer.test:%d" % port], "dns: {refresh_s: 0.2}\nhealth: {interval_s: 0.2}\n"),
                   wrap=wrap)
        wait_members(r, {"127.0.0.2", "127.0.0.3"})
        got = spread(r)
        assert got["127.0.0.2"] > 0 and got["127.0.0.3"] > 0 and got["127.0.0.4"] == 0, got
        assert backs["127.0.0.2"].records[-1]["headers"]["host"] == "pool.wafer.test:%d" % port
        # grows: a third address
        set_hosts(["127.0.0.2", "127.0.0.3", "127.0.0.4"])
        wait_members(r, {"127.0.0.2", "127.0.0.3", "127.0.0.4"})
        got = spread(r)
        assert all(v > 0 for v in got.values()), got
        # shrinks: only the new one is left; nothing goes to the others any more, no request fails
        set_hosts(["127.0.0.4"])
        wait_members(r, {"127.0.0.4"})
        got = spread(r)
        assert got == {"127.0.0.2": 0, "127.0.0.3": 0, "127.0.0.4": 30}, got
        # the name no longer resolves: the router keeps running, says so, and answers 503 meanwhile
        set_hosts([])
        wait_members(r, set())
        assert "cannot resolve 'pool.wafer.test'" in r.log()
        assert r.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}).status_code == 503
        set_hosts(["127.0.0.3"])
        wait_members(r, {"127.0.0.3"})
        assert spread(r, 5)["127.0.0.3"] == 5
    finally:
        for s in backs.values():
            s.close()
        os.unlink(hosts.name)
