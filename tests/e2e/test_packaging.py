"""Packaging: wafer --version, the systemd unit (systemd-analyze verify), the sd_notify messages of
wafer serve on a NOTIFY_SOCKET the test listens on (READY=1 once ready, WATCHDOG=1 at half of
WATCHDOG_USEC, STOPPING=1 on SIGTERM), and `make install DESTDIR=...` (binary, client library and header,
man pages, unit, pkg-config file; a program builds against what was installed)."""
import os
import re
import shutil
import signal
import socket
import subprocess
import time

import httpx
import pytest

from conftest import REPO, STORIES, WAFER_BIN, need


def test_version():
    r = subprocess.run([WAFER_BIN, "--version"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0
    m = re.fullmatch(r"wafer (\d+\.\d+\.\d+) \(commit (\S+)\)\n", r.stdout)
    assert m, r.stdout
    if os.path.exists(os.path.join(REPO, ".git")) and shutil.which("git"):
        # git describe --always --dirty of the checkout it was built from: a commit of this repository
        commit = m.group(2)[:-6] if m.group(2).endswith("-dirty") else m.group(2)
        r = subprocess.run(["git", "-C", REPO, "cat-file", "-e", commit + "^{commit}"], capture_output=True)
        assert r.returncode == 0, "wafer --version names commit %s, which this repository lacks" % commit
    assert "--version" in subprocess.run([WAFER_BIN, "--help"], capture_output=True, text=True).stdout


def test_unit_file_verifies(tmp_path):
    sa = shutil.which("systemd-analyze")
    if not sa:
        pytest.skip("systemd-analyze not installed: the unit file was not verified")
    unit = open(os.path.join(REPO, "packaging", "wafer.service")).read()
    assert "Type=notify" in unit and "Restart=on-failure" in unit and "WatchdogSec=" in unit
    # verify checks that ExecStart exists: point it at the built binary, as make install does for its PREFIX
    (tmp_path / "wafer.service").write_text(unit.replace("/usr/local/bin/wafer", WAFER_BIN))
    r = subprocess.run([sa, "verify", "--man=no", str(tmp_path / "wafer.service")], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    # and it does catch a broken unit (so the check above means something)
    (tmp_path / "bad.service").write_text(unit.replace("Type=notify", "Type=notifyy"))
    r = subprocess.run([sa, "verify", "--man=no", str(tmp_path / "bad.service")], capture_output=True, text=True,
                       timeout=30)
    assert "notifyy" in r.stderr


class NotifySocket:
    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.msgs = []  # (monotonic time, text)

    def wait_for(self, pred, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                break
            self.msgs.append((time.monotonic(), data.decode()))
            if pred(data.decode()):
                return data.decode()
        return None

    def close(self):
        self.sock.close()


def start_serve(env, log, *args):
    """wafer serve with its log in the file log (a pipe would need reading while it runs)."""
    with open(log, "w") as f:
        return subprocess.Popen([WAFER_BIN, "serve", "--model", need(STORIES), "--port", "0", "--threads", "1"]
                                + list(args), env=env, stdout=f, stderr=subprocess.STDOUT)


def port_of(log, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"listening on http://[\d.]+:(\d+)", open(log).read())
        if m:
            return int(m.group(1))
        time.sleep(0.02)
    raise AssertionError("wafer serve did not start listening:\n" + open(log).read())


def test_sd_notify_ready_watchdog_stopping(tmp_path):
    ns = NotifySocket(tmp_path / "notify.sock")
    env = dict(os.environ, NOTIFY_SOCKET=ns.path, WATCHDOG_USEC="400000")  # pings every 0.2 s
    log = tmp_path / "serve.log"
    p = start_serve(env, log)
    try:
        port = port_of(log)
        ready = ns.wait_for(lambda m: "READY=1" in m, 20)
        assert ready is not None and ready.startswith("READY=1")
        # READY=1 came once the model was loaded: /ready already says so
        assert httpx.get("http://127.0.0.1:%d/ready" % port, timeout=5).status_code == 200
        t_ready = time.monotonic()
        ns.wait_for(lambda m: False, 1.2)
        pings = [t for t, m in ns.msgs if m == "WATCHDOG=1"]
        assert len(pings) >= 4, ns.msgs
        gaps = [b - a for a, b in zip(pings, pings[1:])]
        assert all(0.1 < g < 0.5 for g in gaps), gaps  # half of WATCHDOG_USEC, while the I/O loop turns
        assert pings[0] - t_ready < 0.5
        p.send_signal(signal.SIGTERM)
        assert ns.wait_for(lambda m: m == "STOPPING=1", 10) == "STOPPING=1"
        assert p.wait(20) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        ns.close()


def test_sd_notify_off_and_watchdog_for_another_pid(tmp_path):
    ns = NotifySocket(tmp_path / "notify.sock")
    # WATCHDOG_PID names another process: the watchdog is not ours, READY=1 still is
    env = dict(os.environ, NOTIFY_SOCKET=ns.path, WATCHDOG_USEC="200000", WATCHDOG_PID="1")
    log = tmp_path / "serve.log"
    p = start_serve(env, log)
    try:
        port_of(log)
        assert ns.wait_for(lambda m: "READY=1" in m, 20)
        ns.wait_for(lambda m: False, 0.6)
        assert not [m for _, m in ns.msgs if m == "WATCHDOG=1"]
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(20)
        ns.close()
    # without NOTIFY_SOCKET nothing is sent and nothing complains
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    log = tmp_path / "serve2.log"
    p = start_serve(env, log)
    port = port_of(log)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get("http://127.0.0.1:%d/ready" % port, timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    assert p.wait(20) == 0
    out = open(log).read()
    assert "ready:" in out and "NOTIFY_SOCKET" not in out


def test_make_install(tmp_path):
    if not shutil.which("make") or not os.path.exists(os.path.join(REPO, "Makefile")):
        pytest.skip("make or the Makefile is missing")
    build = os.path.relpath(os.path.dirname(WAFER_BIN), REPO)
    dest = tmp_path / "root"
    r = subprocess.run(["make", "-s", "install", "BUILD=" + build, "PREFIX=/usr", "DESTDIR=" + str(dest)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    files = sorted(os.path.relpath(os.path.join(d, f), dest) for d, _, fs in os.walk(dest) for f in fs)
    for want in ["usr/bin/wafer", "usr/include/wafer/client.h", "usr/lib/libwafer-client.a",
                 "usr/lib/libwafer-client.so.0", "usr/lib/libwafer-client.so", "usr/lib/pkgconfig/wafer-client.pc",
                 "usr/lib/systemd/system/wafer.service", "usr/share/man/man1/wafer.1",
                 "usr/share/man/man1/wafer-serve.1", "usr/share/man/man1/wafer-pull.1",
                 "usr/share/man/man1/wafer-client.1"]:
        assert want in files, files
    assert os.access(dest / "usr/bin/wafer", os.X_OK)
    unit = (dest / "usr/lib/systemd/system/wafer.service").read_text()
    assert "ExecStart=/usr/bin/wafer serve" in unit
    # one man page per command, each with the command's own --help in it
    cmds = re.findall(r"^  ([a-z]+) ", subprocess.run([WAFER_BIN, "--help"], capture_output=True,
                                                      text=True).stdout, re.M)
    assert len(cmds) >= 13
    for c in cmds:
        page = (dest / ("usr/share/man/man1/wafer-%s.1" % c)).read_text()
        assert page.startswith(".TH WAFER-%s 1" % c.upper())
        assert "usage: wafer" in page
    pc = (dest / "usr/lib/pkgconfig/wafer-client.pc").read_text()
    assert "libdir=/usr/lib" in pc and "-lwafer-client" in pc
    # a program builds against the installed header and library, and runs
    exe = tmp_path / "gen"
    r = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-I", str(dest / "usr/include"),
                        os.path.join(REPO, "examples", "generate.c"), str(dest / "usr/lib/libwafer-client.a"),
                        "-lcurl", "-ljansson", "-lpthread", "-o", str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe), "http://127.0.0.1:9"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "connect" in r.stderr
    # and against the shared library
    r = subprocess.run(["cc", "-std=c11", "-I", str(dest / "usr/include"), os.path.join(REPO, "examples", "generate.c"),
                        "-L", str(dest / "usr/lib"), "-lwafer-client", "-o", str(tmp_path / "gen_so")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(tmp_path / "gen_so"), "http://127.0.0.1:9"], capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, LD_LIBRARY_PATH=str(dest / "usr/lib")))
    assert r.returncode == 1 and "connect" in r.stderr
