"""A fault-injecting HTTP proxy in front of an S3-compatible server, for tests
and benchmarks of remote sources.

    python faultproxy.py --upstream http://127.0.0.1:PORT --port 0 --port-file F

It forwards every request to the upstream server and can, as set by POST
/__faults__ with a JSON object, add latency to each request (``latency_ms``)
and spoil the next N replies to GETs: ``http503`` (a 503 SlowDown reply),
``cut`` (the connection closed after half the body), ``truncate`` (the
headers promise the whole body, fewer bytes come, then the connection
closes), ``stall`` (no reply for ``stall_ms``).  ``every`` spoils one GET in
that many instead of the next N.  GET /__stats__ returns the requests seen by
method, by kind (``kinds``: LIST, HEAD, GET by extension, each with its count
and payload bytes) and the faults injected.  It runs as its own process, so the client
under test and the proxy do not share an interpreter.
"""

import argparse
import http.client
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("http503", "cut", "truncate", "stall")


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.latency_ms = 0.0
        self.left = {k: 0 for k in FAULTS}
        self.every = 0
        self.kind = None
        self.stall_ms = 0
        self.seen = 0
        self.stats = {"GET": 0, "HEAD": 0, "PUT": 0, "other": 0, "injected": 0,
                      "bytes": 0, "paths": {}, "kinds": {}}

    def pick(self, method):
        """The fault for this request, or None."""
        with self.lock:
            if method != "GET":
                return None
            self.seen += 1
            if self.every and self.kind:
                if self.seen % self.every == 0:
                    self.stats["injected"] += 1
                    return self.kind
                return None
            for k in FAULTS:
                if self.left[k] > 0:
                    self.left[k] -= 1
                    self.stats["injected"] += 1
                    return k
        return None


def request_kind(method, path):
    """What a request is, for the counts by kind: "LIST" (a bucket listing),
    "GET .idx" / "GET .bin" / ... (a GET by the object's extension), "HEAD"."""
    u = urllib.parse.urlsplit(path)
    if method == "GET" and "list-type=" in u.query:
        return "LIST"
    if method in ("GET", "HEAD"):
        ext = u.path.rsplit("/", 1)[-1].rpartition(".")[2]
        return method + (" ." + ext if ext and "." in u.path.rsplit("/", 1)[-1] else "")
    return method


STATE = State()
UPSTREAM = None
LOCAL = threading.local()


def upstream_conn():
    c = getattr(LOCAL, "conn", None)
    if c is None:
        c = http.client.HTTPConnection(UPSTREAM.hostname, UPSTREAM.port, timeout=120)
        LOCAL.conn = c
    return c


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def _control(self, method):
        if self.path.startswith("/__faults__") and method == "POST":
            n = int(self.headers.get("Content-Length") or 0)
            cfg = json.loads(self.rfile.read(n) or b"{}")
            with STATE.lock:
                if cfg.get("reset"):
                    STATE.reset()
                STATE.latency_ms = float(cfg.get("latency_ms", STATE.latency_ms))
                STATE.stall_ms = int(cfg.get("stall_ms", STATE.stall_ms))
                for k in FAULTS:
                    if k in cfg:
                        STATE.left[k] = int(cfg[k])
                if "every" in cfg:
                    STATE.every = int(cfg["every"])
                    STATE.kind = cfg.get("kind")
            body = b"{}"
        elif self.path.startswith("/__stats__"):
            with STATE.lock:
                body = json.dumps(STATE.stats).encode()
        else:
            return False
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return True

    def _forward(self, method):
        if self.path.startswith("/__") and self._control(method):
            return
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        with STATE.lock:
            key = method if method in STATE.stats else "other"
            STATE.stats[key] += 1
            p = urllib.parse.urlsplit(self.path).path
            STATE.stats["paths"][p] = STATE.stats["paths"].get(p, 0) + 1
            kind = request_kind(method, self.path)
            k = STATE.stats["kinds"].setdefault(kind, {"n": 0, "bytes": 0})
            k["n"] += 1
            latency = STATE.latency_ms
            stall = STATE.stall_ms
        if latency:
            time.sleep(latency / 1000.0)
        fault = STATE.pick(method)
        if fault == "http503":
            msg = b"<Error><Code>SlowDown</Code></Error>"
            self.send_response(503)
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        if fault == "stall":
            time.sleep(stall / 1000.0)
            self.close_connection = True
            return
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in ("connection", "keep-alive", "proxy-connection")}
        for attempt in range(2):
            conn = upstream_conn()
            try:
                conn.request(method, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                LOCAL.conn = None
                if attempt:
                    raise
        self.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() in ("connection", "keep-alive", "transfer-encoding", "server", "date"):
                continue
            self.send_header(k, v)
        full = resp.getheader("Content-Length")
        if full is None:  # a chunked reply: passed on whole
            data = resp.read()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            with STATE.lock:
                STATE.stats["bytes"] += len(data)
                STATE.stats["kinds"][kind]["bytes"] += len(data)
            return
        full = int(full)
        self.end_headers()
        if method == "HEAD":
            resp.read()
            return
        # The body streams through in pieces; a fault stops it early and closes.
        stop = full
        if fault == "cut" and full > 1:
            stop = full // 2
        elif fault == "truncate" and full > 1:
            stop = full - 1
        sent = 0
        while sent < full:
            piece = resp.read(min(1 << 20, full - sent))
            if not piece:
                break
            if sent + len(piece) > stop:
                piece = piece[: stop - sent]
            if piece:
                self.wfile.write(piece)
            sent += len(piece)
            if sent >= stop:
                break
        if stop < full:
            self.wfile.flush()
            self.close_connection = True
            conn.close()
            LOCAL.conn = None
            return
        with STATE.lock:
            STATE.stats["bytes"] += sent
            STATE.stats["kinds"][kind]["bytes"] += sent

    def do_GET(self):
        self._forward("GET")

    def do_HEAD(self):
        self._forward("HEAD")

    def do_PUT(self):
        self._forward("PUT")

    def do_POST(self):
        self._forward("POST")

    def do_DELETE(self):
        self._forward("DELETE")


def main():
    global UPSTREAM
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    a = ap.parse_args()
    UPSTREAM = urllib.parse.urlsplit(a.upstream)
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    srv.daemon_threads = True
    if a.port_file:
        with open(a.port_file + ".tmp", "w") as f:
            f.write(str(srv.server_address[1]))
        import os
        os.replace(a.port_file + ".tmp", a.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
