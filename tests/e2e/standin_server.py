"""A stand-in OpenAI-compatible streaming server for testing `wafer bench serve`.

It streams with known delays (first token after ttft_ms, then one chunk every itl_ms, on an absolute
schedule so delays do not drift) and can misbehave on purpose. Behaviour is chosen by a path prefix in the
URL given to wafer (http://127.0.0.1:PORT/<mode> -> POST /<mode>/v1/completions):

  ok          a correct stream (the default, also for a bare /v1/completions)
  status500   HTTP 500 with an OpenAI error body
  cut         two chunks, then the connection is closed mid-stream
  malformed   one chunk, then a data line that is not JSON, then [DONE]
  nodone      a correct stream that ends without data: [DONE]
  errorevent  one chunk, then data: {"error": {...}}
  stall       headers, then nothing for `stall_s` seconds
  nousage     a correct stream without the usage chunk
  double      two tokens per chunk; usage says so
  linger      a correct stream, but after data: [DONE] the body stays open for `stall_s` seconds
  mix         request k (in arrival order) behaves as MIX_CYCLE[k % 5]

A prompt can override the delays for its own request with "ttft=NNN" and "itl=NNN" (milliseconds).
The usage block reports prompt_tokens = words in the prompt * tokens_per_word (rounded), and
completion_tokens = tokens streamed. With prefix_cache=True it also reports
prompt_tokens_details.cached_tokens: the longest run of leading words this prompt shares with an earlier
request's prompt followed by its answer (chat messages' contents joined by spaces), * tokens_per_word, as a
server whose cache kept every finished sequence would. Every request is recorded in server.records.
"""

import json
import math
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MIX_CYCLE = ["ok", "status500", "cut", "malformed", "nodone"]
MODES = {"ok", "status500", "cut", "malformed", "nodone", "errorevent", "stall", "nousage", "double", "mix",
         "linger"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # keep pytest output clean
        pass

    def setup(self):
        super().setup()
        # without this, Nagle holds each small SSE write until the client's delayed ACK (40 ms) arrives
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    # -- helpers -----------------------------------------------------------------------------------
    def _json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _chunk(self, data: bytes):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, obj):
        payload = obj if isinstance(obj, str) else json.dumps(obj)
        self._chunk(("data: " + payload + "\n\n").encode())

    def _split_mode(self):
        parts = [p for p in self.path.split("/") if p]
        if parts and parts[0] in MODES:
            return parts[0], "/" + "/".join(parts[1:])
        return "ok", self.path

    # -- routes ------------------------------------------------------------------------------------
    def do_GET(self):
        mode, path = self._split_mode()
        if path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.server.model_id, "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

    def do_POST(self):
        mode, path = self._split_mode()
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        t0 = time.monotonic()
        srv = self.server
        try:
            req = json.loads(raw)
        except ValueError:
            self._json(400, {"error": {"message": "bad json"}})
            return
        if path == "/tokenize":
            if not srv.tokenize:
                self._json(404, {"error": {"message": "no tokenizer here"}})
                return
            n = srv.prompt_tokens(req.get("content", ""))
            self._json(200, {"tokens": list(range(n))})
            return
        chat = path == "/v1/chat/completions"
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._json(404, {"error": {"message": "no route " + path}})
            return
        if chat:
            prompt = "".join(m.get("content", "") for m in req.get("messages", []))
        else:
            prompt = req.get("prompt", "")
        with srv.lock:
            k = srv.counter
            srv.counter += 1
        if mode == "mix":
            mode = MIX_CYCLE[k % len(MIX_CYCLE)]
        rec = {"k": k, "mode": mode, "chat": chat, "prompt": prompt, "body": req, "prompt_tokens": None,
               "completion_tokens": None, "chunks": 0, "auth": self.headers.get("Authorization")}
        with srv.lock:
            srv.records.append(rec)
        try:
            self._serve_stream(mode, chat, req, prompt, rec, t0)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout): nothing to do

    def _serve_stream(self, mode, chat, req, prompt, rec, t0):
        srv = self.server
        if mode == "status500":
            self._json(500, {"error": {"message": "stand-in failure", "type": "server_error"}})
            return
        m = re.search(r"ttft=(\d+)", prompt)
        ttft = float(m.group(1)) if m else srv.ttft_ms + srv.ttft_per_token_ms * srv.prompt_tokens(prompt)
        m = re.search(r"itl=(\d+)", prompt)
        itl = float(m.group(1)) if m else srv.itl_ms
        n_tokens = max(1, min(int(req.get("max_tokens") or 16), 4096))
        per_chunk = 2 if mode == "double" else 1
        n_chunks = max(1, n_tokens // per_chunk)
        words = srv.answer_for(prompt) or ["tok%d" % i for i in range(n_chunks * per_chunk)]
        n_chunks = min(n_chunks, max(1, math.ceil(len(words) / per_chunk)))

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        if mode == "stall":
            time.sleep(srv.stall_s)
            return
        model = req.get("model") or srv.model_id
        if chat:  # OpenAI sends the role first, with empty content: not a token
            self._event({"id": "c", "object": "chat.completion.chunk", "model": model,
                         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                      "finish_reason": None}]})
        for i in range(n_chunks):
            target = t0 + (ttft + i * itl) / 1000.0
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            text = " " + " ".join(words[i * per_chunk:(i + 1) * per_chunk])
            if chat:
                ev = {"id": "c", "object": "chat.completion.chunk", "model": model,
                      "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
            else:
                ev = {"id": "c", "object": "text_completion", "model": model,
                      "choices": [{"index": 0, "text": text, "finish_reason": None}]}
            self._event(ev)
            rec["chunks"] += 1
            if mode == "cut" and i == 1:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if mode == "malformed" and i == 0:
                self._chunk(b"data: {\"choices\": [{\"text\": oops\n\n")
            if mode == "errorevent" and i == 0:
                self._event({"error": {"message": "stand-in exploded mid-stream", "type": "server_error"}})
                self._chunk(b"")
                return
        if chat:
            last = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {},
                                                                               "finish_reason": "length"}]}
        else:
            last = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "",
                                                                         "finish_reason": "length"}]}
        self._event(last)
        p_tok = srv.prompt_tokens(prompt)
        c_tok = rec["chunks"] * per_chunk
        include = (req.get("stream_options") or {}).get("include_usage")
        if mode != "nousage" and include:
            usage = {"prompt_tokens": p_tok, "completion_tokens": c_tok, "total_tokens": p_tok + c_tok}
            if srv.prefix_cache:
                if chat:
                    seq = " ".join(m.get("content", "") for m in req.get("messages", [])).split()
                else:
                    seq = prompt.split()
                with srv.lock:
                    hit = max([_common_prefix(seq, old) for old in srv.sequences] + [0])
                    srv.sequences.append(seq + words[:rec["chunks"] * per_chunk])
                usage["prompt_tokens_details"] = {"cached_tokens": int(round(hit * srv.tokens_per_word))}
                rec["cached_tokens"] = usage["prompt_tokens_details"]["cached_tokens"]
            self._event({"id": "c", "choices": [], "usage": usage})
            rec["prompt_tokens"] = p_tok
            rec["completion_tokens"] = c_tok
        if mode != "nodone":
            self._event("[DONE]")
        if mode == "linger":
            time.sleep(srv.stall_s)
        self._chunk(b"")  # end of the chunked body


def _common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


class StandinServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # a burst of concurrent connects must not overflow the listen backlog

    def __init__(self, ttft_ms=20.0, itl_ms=5.0, ttft_per_token_ms=0.0, tokens_per_word=1.0, tokenize=False,
                 stall_s=3.0, answers=None, model_id="standin-model", prefix_cache=False):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ttft_ms = ttft_ms
        self.itl_ms = itl_ms
        self.ttft_per_token_ms = ttft_per_token_ms
        self.tokens_per_word = tokens_per_word
        self.tokenize = tokenize
        self.stall_s = stall_s
        self.answers = answers or {}
        self.model_id = model_id
        self.prefix_cache = prefix_cache
        self.sequences = []  # prefix_cache: every finished request's prompt words and answer words
        self.lock = threading.Lock()
        self.counter = 0
        self.records = []
        self._thread = None

    def prompt_tokens(self, prompt):
        return int(round(len(prompt.split()) * self.tokens_per_word))

    def answer_for(self, prompt):
        for key, answer in self.answers.items():
            if key in prompt:
                return answer.split()
        return None

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


class ClosingServer:
    """A TCP listener that accepts and closes every connection at once (no HTTP at all)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.sock.getsockname()[1]

    def _loop(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            conn.recv(65536)
            conn.close()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(2)
        self.sock.close()
        return False
