"""A tiny stand-in of OpenAI's Batch API for testing `wafer jobs` on its own (the real one is wafer serve's).

It implements POST/GET /v1/files, GET /v1/files/{id}/content, POST/GET /v1/batches, GET /v1/batches/{id} and
POST /v1/batches/{id}/cancel with OpenAI's objects, checks what the real server checks first (purpose, JSONL
lines, endpoint), and runs a batch by time: `lines_per_s` lines finish per second after creation, each answered
with {"echo": <the body's prompt or last message>}. Requests are recorded in `records` (method, path, headers).
"""

import json
import re
import threading
import time
from email.parser import BytesParser
from email.policy import default as email_policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


def _error(message, code=None, param=None):
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _record(self):
        with self.server.lock:
            self.server.records.append((self.command, self.path, dict(self.headers)))

    def do_GET(self):
        self._record()
        s = self.server
        path, _, query = self.path.partition("?")
        params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
        with s.lock:
            if path == "/v1/files":
                data = [s.files[k]["meta"] for k in reversed(list(s.files))]
                return self._json(200, {"object": "list", "data": data, "has_more": False})
            m = re.fullmatch(r"/v1/files/([^/]+)(/content)?", path)
            if m:
                f = s.files.get(m.group(1))
                if not f:
                    return self._json(404, _error("No such File object: " + m.group(1), "not_found", "id"))
                if m.group(2):
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(len(f["data"])))
                    self.end_headers()
                    self.wfile.write(f["data"])
                    return
                return self._json(200, f["meta"])
            if path == "/v1/batches":
                limit = int(params.get("limit", "20"))
                ids = list(reversed(list(s.batches)))[:limit]
                data = [s.batch_object(i) for i in ids]
                return self._json(200, {"object": "list", "data": data, "first_id": ids[0] if ids else None,
                                        "last_id": ids[-1] if ids else None, "has_more": len(s.batches) > limit})
            m = re.fullmatch(r"/v1/batches/([^/]+)", path)
            if m:
                if m.group(1) not in s.batches:
                    return self._json(404, _error("No batch found with id '%s'." % m.group(1), "not_found"))
                return self._json(200, s.batch_object(m.group(1)))
        self._json(404, _error("not found"))

    def do_POST(self):
        self._record()
        s = self.server
        body = self._body()
        if self.path == "/v1/files":
            ctype = self.headers.get("Content-Type", "")
            if not ctype.startswith("multipart/form-data"):
                return self._json(415, _error("expected multipart/form-data"))
            msg = BytesParser(policy=email_policy).parsebytes(b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + body)
            fields, content, filename = {}, None, None
            for part in msg.iter_parts():
                name = part.get_param("name", header="content-disposition")
                if name == "file":
                    content = part.get_payload(decode=True)
                    filename = part.get_filename()
                else:
                    fields[name] = part.get_content().strip()
            if fields.get("purpose") != "batch":
                return self._json(400, _error("Invalid purpose", "invalid_purpose", "purpose"))
            lines = []
            for n, line in enumerate(content.decode().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    return self._json(400, _error("Line %d is not valid JSON." % n, "invalid_json_line", "file"))
            if not lines:
                return self._json(400, _error("The file has no requests.", "empty_file", "file"))
            with s.lock:
                s.counter += 1
                fid = "file-standin%d" % s.counter
                meta = {"id": fid, "object": "file", "bytes": len(content), "created_at": int(time.time()),
                        "filename": filename, "purpose": "batch", "status": "processed", "status_details": None}
                s.files[fid] = {"meta": meta, "data": content, "lines": lines}
            return self._json(200, meta)
        if self.path == "/v1/batches":
            req = json.loads(body or b"{}")
            with s.lock:
                f = s.files.get(req.get("input_file_id"))
                if not f:
                    return self._json(404, _error("No file with id '%s'." % req.get("input_file_id"), "not_found",
                                                  "input_file_id"))
                if req.get("endpoint") not in ENDPOINTS:
                    return self._json(400, _error("Invalid value for 'endpoint': '%s'." % req.get("endpoint"),
                                                  "invalid_value", "endpoint"))
                s.counter += 1
                bid = "batch_standin%d" % s.counter
                s.batches[bid] = {"req": req, "lines": f["lines"], "created": time.time(), "status": "in_progress",
                                  "cancelled_at": None, "files": None}
                s.created_requests.append(req)
                return self._json(200, s.batch_object(bid))
        m = re.fullmatch(r"/v1/batches/([^/]+)/cancel", self.path)
        if m:
            with s.lock:
                b = s.batches.get(m.group(1))
                if not b:
                    return self._json(404, _error("No batch found with id '%s'." % m.group(1), "not_found"))
                s.batch_object(m.group(1))  # brings its progress up to now
                if b["status"] == "in_progress":
                    b["status"] = "cancelling"
                    b["cancelled_at"] = time.time()
                return self._json(200, s.batch_object(m.group(1)))
        self._json(404, _error("not found"))


class BatchStandin(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, lines_per_s=50.0):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lines_per_s = lines_per_s
        self.lock = threading.Lock()
        self.files, self.batches = {}, {}
        self.records, self.created_requests = [], []
        self.counter = 0

    def _answer(self, line, i, bid):
        body = line.get("body", {})
        prompt = body.get("prompt") or (body.get("messages") or [{}])[-1].get("content")
        return {"id": "batch_req_%s_%d" % (bid, i), "custom_id": line["custom_id"],
                "response": {"status_code": 200, "request_id": "req_%d" % i, "body": {"echo": prompt}},
                "error": None}

    def batch_object(self, bid):
        """The batch as OpenAI renders it, its progress brought up to now (caller holds the lock)."""
        b = self.batches[bid]
        total = len(b["lines"])
        end = b["cancelled_at"] or time.time()
        done = min(total, int((end - b["created"]) * self.lines_per_s))
        if b["status"] == "in_progress" and done == total:
            b["status"] = "completed"
        if b["status"] == "cancelling":
            b["status"] = "cancelled"
        final = b["status"] in ("completed", "cancelled")
        if final and b["files"] is None:
            out = [json.dumps(self._answer(line, i, bid)) for i, line in enumerate(b["lines"][:done])]
            err = [json.dumps({"id": "batch_req_%s_%d" % (bid, i), "custom_id": line["custom_id"], "response": None,
                               "error": {"code": "batch_cancelled", "message": "cancelled"}})
                   for i, line in enumerate(b["lines"][done:], done)]
            b["files"] = []
            for kind, rows in (("output", out), ("error", err)):
                if not rows:
                    b["files"].append(None)
                    continue
                self.counter += 1
                fid = "file-standin%d" % self.counter
                data = ("\n".join(rows) + "\n").encode()
                self.files[fid] = {"meta": {"id": fid, "object": "file", "bytes": len(data),
                                            "created_at": int(time.time()), "filename": "%s_%s.jsonl" % (bid, kind),
                                            "purpose": "batch_output", "status": "processed",
                                            "status_details": None}, "data": data, "lines": []}
                b["files"].append(fid)
        files = b["files"] or [None, None]
        now = int(time.time())
        return {"id": bid, "object": "batch", "endpoint": b["req"]["endpoint"], "errors": None,
                "input_file_id": b["req"]["input_file_id"], "completion_window": b["req"].get("completion_window"),
                "status": b["status"], "output_file_id": files[0], "error_file_id": files[1],
                "created_at": int(b["created"]), "in_progress_at": int(b["created"]),
                "expires_at": int(b["created"]) + 86400, "finalizing_at": now if final else None,
                "completed_at": now if b["status"] == "completed" else None, "failed_at": None, "expired_at": None,
                "cancelling_at": int(b["cancelled_at"]) if b["cancelled_at"] else None,
                "cancelled_at": now if b["status"] == "cancelled" else None,
                "request_counts": {"total": total, "completed": done,
                                   "failed": total - done if b["status"] == "cancelled" else 0},
                "metadata": b["req"].get("metadata")}

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.server_address[1]

    def __enter__(self):
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()
        return False
