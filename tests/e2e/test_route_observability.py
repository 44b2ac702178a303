"""End-to-end tests of `wafer route`'s own observability: alert rules in the router's YAML evaluated on the
router's measures, firing under generated failures (a faulty backend) and notified once to a real HTTP
receiver on loopback; /v1/alerts; a rule on a measure the router does not have refused with file:line; and
the router's /dashboard in headless Chromium while load runs (per-backend health and traffic share)."""
import os
import re
import subprocess
import threading
import time

import httpx

from conftest import REPO, WAFER_BIN
from test_observability import Receiver, chromium
from test_route import free_port, pools_yaml, router, standin  # noqa: F401 (fixtures)


def route_load(r, seconds, threads=3, body=None):
    """Sends completions through the router from `threads` threads for `seconds` (answers of any status)."""
    stop = time.time() + seconds
    body = body or {"model": "m", "prompt": "x", "max_tokens": 3}

    def worker():
        with httpx.Client(base_url=r.base, timeout=10) as c:
            while time.time() < stop:
                c.post("/v1/completions", json=body)
                time.sleep(0.01)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    return ts


def alerts_yaml(tmp_path, receiver_url):
    return f"""
alerts:
  interval_s: 0.25
  data_dir: {tmp_path / "alerts"}
  external_url: http://router.test:8080
  rules:
    - name: RouterErrors
      measure: error_rate
      window_s: 2
      op: '>'
      threshold: 0.2
      severity: page
      labels: {{team: edge}}
      annotations: {{summary: "{{{{ $value }}}} of the answers fail"}}
    - name: RouterSlow
      measure: e2e_p95_ms
      window_s: 2
      threshold: 60000
  receivers:
    - {{name: ops, kind: webhook, url: "{receiver_url}", group_interval_s: 0.5}}
"""


def test_route_alert_fires_on_a_faulty_backend_and_notifies_once(standin, router, tmp_path):
    good, bad = standin(), standin(mode="status500")
    rec = Receiver().start()
    try:
        r = router(pools_yaml({"p": [good.url, bad.url]}) + "routes:\n  - {model: '*', pool: p}\n"
                   "retries: {max: 0}\nhealth: {eject_after: 0, interval_s: 30}\n" +
                   alerts_yaml(tmp_path, rec.url("/hook")))
        assert "route: alerts: 2 rule(s)" in r.log()
        a = r.client.get("/v1/alerts").json()
        assert a["status"] == "success" and a["data"]["alerts"] == []
        assert {x["name"]: x["state"] for x in a["rules"]} == {"RouterErrors": "inactive", "RouterSlow": "inactive"}
        # half the attempts hit the faulty backend: about half the answers are 500s
        ts = route_load(r, 2.5)
        firing = rec.wait(1, lambda p: p["body"]["status"] == "firing", timeout=15)
        for t in ts:
            t.join()
        body = firing[0]["body"]
        assert body["version"] == "4" and body["receiver"] == "ops"
        assert body["groupKey"] == '{}:{alertname="RouterErrors"}'
        assert body["externalURL"] == "http://router.test:8080"
        al = body["alerts"][0]
        assert al["labels"] == {"alertname": "RouterErrors", "severity": "page", "team": "edge"}
        assert re.match(r"0\.[0-9]+ of the answers fail", al["annotations"]["summary"]), al
        a = r.client.get("/alerts").json()
        states = {x["name"]: x["state"] for x in a["rules"]}
        assert states["RouterSlow"] == "inactive"
        assert states["RouterErrors"] in ("firing", "resolved")
        assert a["notifications"]["receivers"] == ["ops"]
        # no traffic: no samples in the window, so it resolves, and the receiver is told once of each
        rec.wait(1, lambda p: p["body"]["status"] == "resolved", timeout=15)
        time.sleep(1.0)
        assert len(rec.get(lambda p: p["body"]["status"] == "firing")) == 1, rec.get()
        assert len(rec.get(lambda p: p["body"]["status"] == "resolved")) == 1, rec.get()
        assert r.client.get("/v1/alerts").json()["notifications"]["sent"] == 2
        m = r.metrics()
        assert m['wafer_route_requests_total{status="5xx"}'] > 0
    finally:
        rec.stop()


def test_route_rule_on_a_measure_the_router_lacks_is_a_config_error(tmp_path):
    cfg = tmp_path / "route.yaml"
    cfg.write_text("pools:\n  - {name: p, backends: ['http://127.0.0.1:9']}\nroutes:\n  - {model: '*', pool: p}\n"
                   "alerts:\n  rules:\n    - {name: A, measure: error_rate, threshold: 0.1}\n"
                   "    - {name: KV, measure: kv_usage, threshold: 0.9}\n")
    r = subprocess.run([WAFER_BIN, "route", "--config", str(cfg), "--port", "0"], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode != 0
    assert f"{cfg}:8: alerts.rules[1].measure: 'kv_usage' is not measured by wafer route" in r.stderr, r.stderr
    cfg.write_text("pools:\n  - {name: p, backends: ['http://127.0.0.1:9']}\nroutes:\n  - {model: '*', pool: p}\n"
                   "alerts:\n  rules:\n    - {name: A, measure: error_rat, threshold: 0.1}\n")
    r = subprocess.run([WAFER_BIN, "route", "--config", str(cfg), "--port", "0"], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode != 0 and f"{cfg}:7:" in r.stderr and "error_rat" in r.stderr, r.stderr


def test_route_dashboard_in_chromium(standin, router, tmp_path):
    browser = chromium()
    a, b = standin(), standin()
    dead = f"http://127.0.0.1:{free_port()}"
    a.token_s = b.token_s = 0.005
    r = router(pools_yaml({"p": [a.url, b.url, dead]}) + "routes:\n  - {model: '*', pool: p}\n"
               "retries: {max: 2, base_ms: 1, cap_ms: 5}\nhealth: {interval_s: 0.3, timeout_ms: 300}\n",
               wait_ready=True)
    page = r.client.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<script" in page.text and "src=" not in page.text and "http://" not in page.text.split("<script")[1]
    assert r.client.get("/v1/stats?window=0").status_code == 400
    ts = route_load(r, 14, threads=3, body={"model": "m", "prompt": "x", "max_tokens": 4, "stream": True})
    time.sleep(3)
    st = r.client.get("/v1/stats").json()
    by = {x["url"]: x for x in st["backends"]}
    assert by[dead]["up"] is False and by[a.url]["up"] is True
    assert st["measures"]["requests_per_second"] > 0
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr",
            "--v=0", "--virtual-time-budget=3000"]

    def dump():
        p = subprocess.run(base + ["--dump-dom", r.base + "/dashboard"], capture_output=True, text=True, timeout=25)
        rows = {}
        for label, cells in re.findall(r'<tr data-backend="([^"]+)">(.*?)</tr>', p.stdout):
            rows[label] = dict(re.findall(r'data-metric="([a-z_]+)" data-value="([^"]*)"', cells))
        vals = dict(re.findall(r'data-metric="([a-z0-9_]+)" data-value="([^"]*)"', p.stdout))
        return vals, rows, p.stderr

    art = os.path.join(REPO, "build", "artifacts")
    os.makedirs(art, exist_ok=True)

    def screenshot(name, size):
        out = os.path.join(art, name)
        if os.path.exists(out):
            os.unlink(out)
        subprocess.run(base + [f"--window-size={size}", f"--screenshot={out}", r.base + "/dashboard"],
                       capture_output=True, timeout=25)
        assert os.path.getsize(out) > 10000

    v1, rows, err = dump()
    screenshot("route-dashboard.png", "1280,900")  # while the load runs
    v2, rows2, err2 = dump()
    screenshot("route-dashboard-phone.png", "390,1400")
    assert len(rows) == 3, rows
    dead_label = dead.split("//")[1]
    assert rows[dead_label]["backend_up"] == "0", rows
    live = [k for k in rows if k != dead_label]
    shares = [float(rows[k]["backend_share"]) for k in live]
    assert all(s > 0.2 for s in shares) and abs(sum(shares) - 1) < 0.01, rows  # the dead one gets no share
    assert rows[dead_label]["backend_share"] in ("", "0")
    assert all(rows[k]["backend_up"] == "1" for k in live)
    assert float(v1["requests_per_second"]) > 0 and float(v1["e2e_p95_ms"]) > 0
    assert v1["uptime_s"] != v2["uptime_s"]
    for e in (err, err2):
        assert "CONSOLE" not in e and "Uncaught" not in e, e[-2000:]
    for t in ts:
        t.join()
