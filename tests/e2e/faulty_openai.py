"""A faulty OpenAI-compatible server for testing the client library's retries, timeouts and streams.

Each request's behaviour comes from a script in the URL: the client's base URL is
http://127.0.0.1:PORT/s/<step,step,...> and request k (counted per script) gets step min(k, len - 1):

  ok          a correct answer: completions, chat (non-streaming JSON or SSE), GET (a JSON body)
  429ra1      429 with Retry-After: 1
  429ms300    429 with Retry-After-Ms: 300
  429         429 without Retry-After
  503         503
  400         400 with an OpenAI error body
  shouldnot   503 with x-should-retry: false
  reset       the connection is reset (RST) without an answer
  slowN       N seconds (may be fractional, e.g. slow2.5) before the answer's first byte, then ok
  cut         a stream: one event, then the connection is closed
  errorevent  a stream: one event, then data: {"error": ...}

The answer's text is "hello world" (streamed as "hello", " world"). Every request is recorded in
server.records as dicts {script, step, port, t, body, path} (a multipart body as {"multipart": its text}).

The Batch API's paths answer "ok" with canned objects (enough for the client library's jobs calls):
POST /v1/files (a file object "file-f1" with the upload's size), POST /v1/batches (batch "batch_f1",
in_progress), GET /v1/batches/{id} (completed, output file "file-out"), POST /v1/batches/{id}/cancel
(cancelling), GET /v1/batches (a list of one), GET /v1/files/{id}/content (two JSONL lines).
"""
import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _json(self, status, obj, headers=None):
        body = json.dumps(obj).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _event(self, obj):
        data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):
        self._handle(None)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(n)
        if self.headers.get("Content-Type", "").startswith("multipart/form-data"):
            return self._handle({"multipart": raw.decode("utf-8", "replace")})
        self._handle(json.loads(raw or b"{}"))

    def _batch_api(self, body):
        """The canned Batch API answers; False when the path is not one of its."""
        path = self.path.split("?")[0]
        i = path.find("/v1/")
        api = path[i:] if i >= 0 else ""
        batch = {"id": "batch_f1", "object": "batch", "endpoint": "/v1/completions", "errors": None,
                 "input_file_id": "file-f1", "completion_window": "24h", "status": "in_progress",
                 "output_file_id": None, "error_file_id": None, "created_at": 1700000000,
                 "request_counts": {"total": 2, "completed": 0, "failed": 0}, "metadata": None}
        if api == "/v1/files" and body is not None:
            size = len(body.get("multipart", ""))
            self._json(200, {"id": "file-f1", "object": "file", "bytes": size, "created_at": 1700000000,
                             "filename": "in.jsonl", "purpose": "batch", "status": "processed"})
        elif api == "/v1/batches" and body is not None:
            self._json(200, batch)
        elif api == "/v1/batches":
            self._json(200, {"object": "list", "data": [batch], "first_id": "batch_f1", "last_id": "batch_f1",
                             "has_more": False})
        elif api.startswith("/v1/batches/") and api.endswith("/cancel"):
            self._json(200, dict(batch, status="cancelling"))
        elif api.startswith("/v1/batches/"):
            self._json(200, dict(batch, status="completed", output_file_id="file-out",
                                 request_counts={"total": 2, "completed": 2, "failed": 0}))
        elif api.startswith("/v1/files/") and api.endswith("/content"):
            data = b'{"custom_id": "a", "response": {"status_code": 200}}\n{"custom_id": "b", "response": {"status_code": 200}}\n'
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            return False
        return True

    def _handle(self, body):
        srv = self.server
        parts = self.path.split("/")
        script = parts[2].split(",") if len(parts) > 2 and parts[1] == "s" else ["ok"]
        key = parts[2] if len(parts) > 2 else ""
        with srv.lock:
            k = srv.counts.get(key, 0)
            srv.counts[key] = k + 1
            step = script[min(k, len(script) - 1)]
            srv.records.append({"script": key, "step": step, "port": self.client_address[1], "t": time.time(),
                                "body": body, "path": self.path})
        chat = self.path.endswith("/chat/completions")
        stream = bool(body and body.get("stream"))
        if step.startswith("slow"):
            time.sleep(float(step[4:]))
            step = "ok"
        if step == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        err = {"error": {"message": "step " + step, "type": "server_error", "param": None, "code": None}}
        if step == "429ra1":
            return self._json(429, err, {"Retry-After": "1"})
        if step == "429ms300":
            return self._json(429, err, {"Retry-After-Ms": "300"})
        if step in ("429", "503", "400"):
            return self._json(int(step), err)
        if step == "shouldnot":
            return self._json(503, err, {"x-should-retry": "false"})
        if self._batch_api(body):
            return
        if body is None:
            return self._json(200, {"status": "ready"})
        obj = "chat.completion" if chat else "text_completion"
        if not stream:
            choice = {"index": 0, "finish_reason": "stop"}
            if chat:
                choice["message"] = {"role": "assistant", "content": "hello world"}
            else:
                choice["text"] = "hello world"
            return self._json(200, {"id": "x", "object": obj, "model": "m", "choices": [choice],
                                    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def piece(t, fin=None):
            c = {"index": 0, "finish_reason": fin}
            if chat:
                c["delta"] = {"content": t}
            else:
                c["text"] = t
            return {"id": "x", "object": obj + (".chunk" if chat else ""), "choices": [c]}

        self._event(piece("hello"))
        if step == "cut":
            time.sleep(0.05)
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if step == "errorevent":
            self._event({"error": {"message": "the engine failed", "type": "server_error"}})
            self._event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            return
        self._event(piece(" world"))
        self._event(piece("", "stop"))
        self._event({"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                                          "total_tokens": 5}})
        self._event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")


class FaultyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.counts = {}
        self.records = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def url(self, script):
        return "http://127.0.0.1:%d/s/%s" % (self.server_address[1], script)

    def requests(self, script):
        return [r for r in self.records if r["script"] == script]

    def close(self):
        self.shutdown()
        self.server_close()
