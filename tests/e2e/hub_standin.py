"""A stand-in of the Hugging Face hub's HTTP API on loopback, for testing `wafer pull` without internet.

It answers as huggingface.co does for the endpoints huggingface_hub (and wafer) use:

  GET  /api/models/{owner}/{name}/tree/{rev}?recursive=true
         [{"type": "file", "oid": <git blob id>, "size": N, "path": P, "lfs": {"oid": <sha256>, "size": N,
           "pointerSize": 134}}, ...] (lfs only for LFS files), paginated with Link: <...>; rel="next"
  HEAD/GET /{owner}/{name}/resolve/{rev}/{path}
         LFS files: 302 to the CDN with X-Linked-Etag: "<sha256>", X-Linked-Size, ETag, X-Repo-Commit;
         other files: 200 with the bytes. Errors: 401 (private repo, no or a wrong token), 404 with
         X-Error-Code RepoNotFound / EntryNotFound / RevisionNotFound and X-Error-Message.
  GET  {cdn}/repos/{sha256}?sig=...   the bytes, Accept-Ranges: bytes, Range -> 206 Content-Range, ETag

The CDN listens on a second port (another "host" to curl, as cdn-lfs.huggingface.co is), so a test can
check that the token is not sent there.

Misbehaviour, per repo (Repo.faults, a set; each can be added and removed while a test runs):
  cut_once      the first CDN response is cut (connection closed) after cut_bytes bytes
  cut_always    every CDN response is cut after cut_bytes bytes
  bad_sha       X-Linked-Etag and the tree's lfs.oid announce a checksum the bytes do not have
  no_range      the CDN ignores Range (always 200 with the whole file)
  cdn_503_once  the first CDN request gets 503 with Retry-After: 0
  slow          the CDN sends the body in 20 pieces over Repo.slow_s seconds (a slow download, for tests of
                what else goes on meanwhile)
Every request is recorded in Hub.records as dicts {server, method, path, range, auth}.
"""

import hashlib
import json
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Repo:
    def __init__(self, files, token=None):
        self.files = dict(files)  # path -> bytes
        self.token = token  # private repo: this Bearer token is required
        self.faults = set()
        self.cut_bytes = 100_000
        self.slow_s = 3.0
        self.cdn_hits = 0


def _sha256(b):
    return hashlib.sha256(b).hexdigest()


def _git_oid(b):
    return hashlib.sha1(b"blob %d\0" % len(b) + b).hexdigest()


class Hub:
    COMMIT = "0123456789abcdef0123456789abcdef01234567"

    def __init__(self, page_size=1000):
        self.repos = {}
        self.records = []
        self.page_size = page_size
        self.lock = threading.Lock()
        self.api = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self, "api"))
        self.cdn = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self, "cdn"))
        self.api.daemon_threads = self.cdn.daemon_threads = True
        for s in (self.api, self.cdn):
            threading.Thread(target=s.serve_forever, daemon=True).start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.api.server_address[1]

    @property
    def cdn_url(self):
        return "http://127.0.0.1:%d" % self.cdn.server_address[1]

    def add(self, repo, files, token=None):
        r = Repo(files, token)
        self.repos[repo] = r
        return r

    def blob(self, sha):
        for r in self.repos.values():
            for b in r.files.values():
                if _sha256(b) == sha:
                    return r, b
        return None, None

    def cdn_requests(self):
        return [x for x in self.records if x["server"] == "cdn"]

    def close(self):
        for s in (self.api, self.cdn):
            s.shutdown()
            s.server_close()


def _make_handler(hub, which):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            pass

        def _record(self):
            with hub.lock:
                hub.records.append({"server": which, "method": self.command, "path": self.path,
                                    "range": self.headers.get("Range"),
                                    "auth": self.headers.get("Authorization")})

        def _send(self, status, body=b"", headers=None, content_type="application/json"):
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if content_type:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status, code, message):
            body = json.dumps({"error": message}).encode()
            self._send(status, body, {"X-Error-Code": code, "X-Error-Message": message} if code else
                       {"X-Error-Message": message})

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            self._record()
            if which == "cdn":
                return self._cdn()
            u = urllib.parse.urlsplit(self.path)
            parts = [urllib.parse.unquote(p) for p in u.path.split("/")]
            # /api/models/{owner}/{name}/tree/{rev}
            if len(parts) >= 7 and parts[1:3] == ["api", "models"] and parts[5] == "tree":
                return self._tree("/".join(parts[3:5]), parts[6], urllib.parse.parse_qs(u.query))
            # /{owner}/{name}/resolve/{rev}/{path...}
            if len(parts) >= 6 and parts[3] == "resolve":
                return self._resolve("/".join(parts[1:3]), parts[4], "/".join(parts[5:]))
            self._error(404, None, "Not Found")

        def _auth(self, repo_name):
            r = hub.repos.get(repo_name)
            got = self.headers.get("Authorization")
            if r is None:
                # the hub answers 401 for a missing repo to anonymous callers (it may be private)
                if not got:
                    self._error(401, "RepoNotFound", "Repository Not Found for url: " + self.path)
                else:
                    self._error(404, "RepoNotFound", "Repository Not Found for url: " + self.path)
                return None
            if r.token and got != "Bearer " + r.token:
                self._error(401, None, "Invalid username or password.")
                return None
            return r

        def _tree(self, repo_name, rev, query):
            r = self._auth(repo_name)
            if not r:
                return
            if rev != "main":
                return self._error(404, "RevisionNotFound", "Invalid rev id: " + rev)
            entries = []
            for path, b in sorted(r.files.items()):
                e = {"type": "file", "oid": _git_oid(b), "size": len(b), "path": path}
                if path.endswith(".gguf"):
                    sha = "0" * 64 if "bad_sha" in r.faults else _sha256(b)
                    e["lfs"] = {"oid": sha, "size": len(b), "pointerSize": 134}
                entries.append(e)
            start = int(query.get("cursor", ["0"])[0])
            page = entries[start:start + hub.page_size]
            headers = {}
            if start + hub.page_size < len(entries):
                nxt = "%s/api/models/%s/tree/%s?recursive=true&cursor=%d" % (hub.url, repo_name, rev,
                                                                               start + hub.page_size)
                headers["Link"] = '<%s>; rel="next"' % nxt
            self._send(200, json.dumps(page).encode(), headers)

        def _resolve(self, repo_name, rev, path):
            r = self._auth(repo_name)
            if not r:
                return
            if rev != "main":
                return self._error(404, "RevisionNotFound", "Invalid rev id: " + rev)
            b = r.files.get(path)
            if b is None:
                return self._error(404, "EntryNotFound", "Entry not found")
            common = {"X-Repo-Commit": Hub.COMMIT, "Accept-Ranges": "bytes"}
            if not path.endswith(".gguf"):  # a regular git file
                return self._send(200, b, dict(common, ETag='"%s"' % _git_oid(b)), "text/plain")
            sha = "0" * 64 if "bad_sha" in r.faults else _sha256(b)
            loc = "%s/repos/%s?sig=%d" % (hub.cdn_url, _sha256(b), int(time.time()))
            self._send(302, b"", dict(common, Location=loc, ETag='"%s"' % _git_oid(b),
                                      **{"X-Linked-Etag": '"%s"' % sha, "X-Linked-Size": str(len(b))}), None)

        def _cdn(self):
            sha = urllib.parse.urlsplit(self.path).path.rsplit("/", 1)[-1]
            r, b = hub.blob(sha)
            if b is None:
                return self._send(404, b"<Error>NoSuchKey</Error>", content_type="application/xml")
            with hub.lock:
                r.cdn_hits += 1
                first = r.cdn_hits == 1
            if "cdn_503_once" in r.faults and first:
                return self._send(503, b"slow down", {"Retry-After": "0"}, "text/plain")
            start = 0
            rng = self.headers.get("Range")
            status = 200
            headers = {"Accept-Ranges": "bytes", "ETag": '"%s"' % sha}
            if rng and "no_range" not in r.faults:
                start = int(rng.split("=")[1].split("-")[0])
                if start >= len(b):
                    return self._send(416, b"", {"Content-Range": "bytes */%d" % len(b)}, None)
                status = 206
                headers["Content-Range"] = "bytes %d-%d/%d" % (start, len(b) - 1, len(b))
            body = b[start:]
            cut = ("cut_always" in r.faults) or ("cut_once" in r.faults and first)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command == "HEAD":
                return
            if cut:
                self.wfile.write(body[:r.cut_bytes])
                self.wfile.flush()
                # a dropped connection, mid-body
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if "slow" in r.faults:
                step = max(1, len(body) // 20)
                for i in range(0, len(body), step):
                    self.wfile.write(body[i:i + step])
                    self.wfile.flush()
                    time.sleep(r.slow_s / 20)
                return
            self.wfile.write(body)

    return H
