"""A faulty OpenAI-compatible backend for the `wafer route` tests, in a thread of the test process.

It speaks /v1/completions and /v1/chat/completions (streamed or not), /v1/models, /ready and /metrics like
wafer serve, with a toy deterministic "model" so answers can be compared exactly: a text prompt's tokens
are its bytes, a token-id prompt is taken as is, and each next token is a function of the whole context
(next = (31 * sum(context) + len(context)) % 1000, text "<id>"). So a request resumed with
prompt = prompt tokens + generated tokens continues exactly as the unbroken run would, as with a greedy
model. With "return_token_ids": true the chunks carry token_ids (and the first one prompt_token_ids), as
wafer serve does.

Behaviour per request comes from `mode` (a default) or the queue `script` (consumed first, one mode per
generation request):
  ok        a correct answer
  status500 HTTP 500 with an OpenAI error body
  status429 HTTP 429 with Retry-After: retry_after (when set)
  hang      reads the request, then sends nothing for hang_s seconds
  slow      waits slow_s seconds before the response head, then answers correctly
  cut       a stream that stops after cut_after events: the connection is closed mid-body
  garbage   bytes that are not HTTP, then a close
  badjson   cut_after events, then a data line that is not JSON
Every request is recorded in `records` (path, body); `counts` counts by path; `running` is the number of
generations in progress (reported in /metrics as wafer_requests_running, plus `extra_load`).
"""

import collections
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def next_token(ctx):
    return (31 * sum(ctx) + len(ctx)) % 1000


def generate(prompt_ids, n):
    ctx = list(prompt_ids)
    out = []
    for _ in range(n):
        t = next_token(ctx)
        out.append(t)
        ctx.append(t)
    return out


def text_of(ids):
    return "".join("<%d>" % t for t in ids)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.owner.lock:
            self.server.owner.conns.add(self.connection)

    def finish(self):
        with self.server.owner.lock:
            self.server.owner.conns.discard(self.connection)
        super().finish()

    def _json(self, status, obj, headers=None):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def _chunk(self, data: bytes):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, obj):
        self._chunk(("data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n").encode())

    def do_GET(self):
        srv = self.server.owner
        with srv.lock:
            srv.counts[self.path] += 1
        if self.path == "/ready":
            self._json(200 if srv.ready else 503, {"status": "ready" if srv.ready else "loading"})
        elif self.path == "/metrics":
            body = ("wafer_requests_running %d\nwafer_requests_waiting %d\n" %
                    (srv.running + srv.extra_load, 0)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "standin"}
                                                        for m in srv.models]})
        else:
            self._json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

    def do_POST(self):
        srv = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        with srv.lock:
            srv.counts[self.path] += 1
            mode = srv.script.popleft() if srv.script else srv.mode
        try:
            req = json.loads(raw)
        except ValueError:
            self._json(400, {"error": {"message": "bad json"}})
            return
        with srv.lock:
            srv.records.append({"path": self.path, "body": req, "mode": mode,
                                "headers": {k.lower(): v for k, v in self.headers.items()}})
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._json(404, {"error": {"message": "no route " + self.path}})
            return
        try:
            self._generate(srv, mode, req, self.path == "/v1/chat/completions")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _generate(self, srv, mode, req, chat):
        if mode == "status500":
            self._json(500, {"error": {"message": "stand-in failure", "type": "server_error", "code": "internal"}})
            return
        if mode == "status429":
            hdr = {"Retry-After": str(srv.retry_after)} if srv.retry_after is not None else {}
            self._json(429, {"error": {"message": "busy", "type": "rate_limit_error", "code": "queue_full"}}, hdr)
            return
        if mode == "garbage":
            self.wfile.write(b"SURPRISE! this is not HTTP\r\n\r\n")
            self.wfile.flush()
            self.close_connection = True
            return
        if mode == "hang":
            time.sleep(srv.hang_s)
            self.close_connection = True
            return
        if mode == "slow":
            time.sleep(srv.slow_s)
        if chat:
            text = "".join(m.get("content", "") for m in req.get("messages", []))
            prompt = list(text.encode())
        else:
            p = req.get("prompt", "")
            prompt = list(p) if isinstance(p, list) else list(p.encode())
        n = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        ids = generate(prompt, n)
        want_ids = bool(req.get("return_token_ids"))
        model = req.get("model") or srv.models[0]
        cid = ("chatcmpl-" if chat else "cmpl-") + "standin%d" % srv.next_id()
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)}
        with srv.lock:
            srv.running += 1
        try:
            if not req.get("stream"):
                time.sleep(srv.token_s * len(ids))
                choice = {"index": 0, "logprobs": None, "finish_reason": "length"}
                if chat:
                    choice["message"] = {"role": "assistant", "content": text_of(ids)}
                else:
                    choice["text"] = text_of(ids)
                self._json(200, {"id": cid, "object": "chat.completion" if chat else "text_completion",
                                 "created": 1, "model": model, "choices": [choice], "usage": usage})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            obj = "chat.completion.chunk" if chat else "text_completion"
            sent = 0
            if chat:
                self._event({"id": cid, "object": obj, "created": 1, "model": model,
                             "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                          "finish_reason": None}]})
                sent += 1
            for i, t in enumerate(ids):
                if mode == "cut" and sent >= srv.cut_after:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if mode == "badjson" and sent >= srv.cut_after:
                    self._event("{this is not json")
                    self._chunk(b"")
                    return
                time.sleep(srv.token_s)
                if srv.comments:  # SSE comments (keep-alives) between events
                    self._chunk(b": keep-alive\n\n")
                choice = {"index": 0, "logprobs": None, "finish_reason": "length" if i == len(ids) - 1 else None}
                if chat:
                    choice["delta"] = {"content": text_of([t])}
                else:
                    choice["text"] = text_of([t])
                if want_ids:
                    choice["token_ids"] = [t]
                    if i == 0:
                        choice["prompt_token_ids"] = prompt
                self._event({"id": cid, "object": obj, "created": 1, "model": model, "choices": [choice]})
                sent += 1
            if (req.get("stream_options") or {}).get("include_usage"):
                self._event({"id": cid, "object": obj, "created": 1, "model": model, "choices": [], "usage": usage})
            self._event("[DONE]")
            self._chunk(b"")
        finally:
            with srv.lock:
                srv.running -= 1


class Standin:
    def __init__(self, models=("standin",), mode="ok", host="127.0.0.1", port=0):
        self.models = list(models)
        self.mode = mode
        self.script = collections.deque()
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.records = []
        self.conns = set()
        self.ready = True
        self.running = 0
        self.extra_load = 0
        self.comments = False
        self.token_s = 0.0
        self.hang_s = 5.0
        self.slow_s = 1.0
        self.cut_after = 3
        self.retry_after = None
        self._id = 0
        self.httpd = ThreadingHTTPServer((host, port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self
        self.port = self.httpd.server_address[1]
        self.url = "http://%s:%d" % (host, self.port)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def next_id(self):
        with self.lock:
            self._id += 1
            return self._id

    def generations(self):
        with self.lock:
            return self.counts["/v1/completions"] + self.counts["/v1/chat/completions"]

    def close(self):
        """Stops listening and closes the connections it has open (keep-alive ones too)."""
        self.httpd.shutdown()
        self.httpd.server_close()
        with self.lock:
            for c in list(self.conns):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
