"""The HTTP side of ``fastcrit serve`` (serve.py): the threaded server and its request handler,
which reads a body (Content-Length or chunked, at most ``MAX_BODY_BYTES``), checks the route,
the method and the API key, and hands the request to the ``ChatServer`` as ``self.server.app``."""

from __future__ import annotations

import hmac
import json
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fastcrit.rollout.openai_api import RequestError

MAX_BODY_BYTES = 16 * 1024 * 1024
# path -> the methods it answers; any other method on a known path gets 405
# (HEAD where GET is: `curl -I` and load balancers' health checks send it; _send omits its body)
_ROUTES = {
    "/health": ("GET", "HEAD"),
    "/v1/models": ("GET", "HEAD"),
    "/v1/chat/completions": ("POST",),
    "/v1/completions": ("POST",),
}


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many clients connect at once (HTTPChat's concurrency); 5 would drop SYNs
    app = None  # the ChatServer (serve.py) that answers the requests; it sets itself here


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"
    error_content_type = "application/json"

    def log_message(self, format, *args) -> None:  # `format` shadows the builtin: the base class's signature
        if self.server.app.log_requests:
            sys.stderr.write(f"fastcrit serve: {self.address_string()} {format % args}\n")

    def _send(self, status: int, obj: dict, headers: dict | None = None) -> None:
        data = json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, err: RequestError, headers: dict | None = None) -> None:
        self._send(err.status, err.body(), headers)

    def send_error(self, code, message=None, explain=None) -> None:
        """What the base class answers itself (a bad request line, an unknown method, a header
        too long): OpenAI's JSON error shape instead of an HTML page."""
        self.close_connection = True
        try:
            text = message or self.responses.get(code, ("error",))[0]
            self._error(
                RequestError(
                    code,
                    f"{text}{': ' + explain if explain else ''}",
                    kind="invalid_request_error" if code < 500 else "server_error",
                )
            )
        except Exception:  # the connection is gone; nothing to tell
            pass

    def _sse(self, chunks) -> None:
        """Server-sent events: ``data: {...}`` per chunk as it comes, then ``data: [DONE]``; the
        connection closes after (no Content-Length), as a streamed OpenAI response does. A failure
        after the headers went out is sent as an ``{"error": ...}`` event, as vLLM does."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            try:
                for c in chunks:
                    self.wfile.write(b"data: " + json.dumps(c).encode("utf-8") + b"\n\n")
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                raise
            except Exception as e:
                err = RequestError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error")
                self.wfile.write(b"data: " + json.dumps(err.body()).encode("utf-8") + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client left
            pass
        finally:  # closing a live stream's chunks now (not when collected) stops a call nobody else waits on
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def _read_body(self) -> bytes:
        """The body by Content-Length or chunked transfer coding; RequestError 411 / 413 / 400."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts, total = [], 0
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise RequestError(400, "a malformed chunk size in the chunked body") from None
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return b"".join(parts)
                total += size
                if total > MAX_BODY_BYTES:
                    raise RequestError(413, f"the body has more than {MAX_BODY_BYTES} bytes")
                parts.append(self.rfile.read(size))
                self.rfile.readline(1024)  # the CRLF after the chunk
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            if self.command in ("POST", "PUT", "PATCH"):
                raise RequestError(411, "a Content-Length header or Transfer-Encoding: chunked is required")
            return b""
        try:
            length = int(length_header)
        except ValueError:
            length = -1
        if length < 0:
            raise RequestError(400, f"Content-Length {length_header!r} is not a byte count")
        if length > MAX_BODY_BYTES:
            raise RequestError(413, f"the body has {length} bytes, more than {MAX_BODY_BYTES}")
        return self.rfile.read(length)

    def _route(self) -> None:
        app = self.server.app
        path = urllib.parse.urlsplit(self.path).path.rstrip("/") or "/"
        try:
            raw = self._read_body()
        except RequestError as e:
            self.close_connection = True  # what is left of the body cannot be told from the next request
            return self._error(e)
        if path != "/health" and app.api_key is not None:
            auth = self.headers.get("Authorization", "")
            if not (
                # the scheme is case-insensitive (RFC 7235): some clients send "bearer"
                auth[:7].lower() == "bearer " and hmac.compare_digest(auth[7:].strip().encode(), app.api_key.encode())
            ):
                return self._error(
                    RequestError(
                        401, "a valid API key is required: send 'Authorization: Bearer <key>'", code="invalid_api_key"
                    ),
                    {"WWW-Authenticate": "Bearer"},
                )
        model_id = None
        if path.startswith("/v1/models/"):
            model_id = urllib.parse.unquote(path[len("/v1/models/") :])
            allowed = ("GET", "HEAD")
        elif path in _ROUTES:
            allowed = _ROUTES[path]
        else:
            return self._error(
                RequestError(404, f"no route {self.command} {path}", kind="not_found_error", code="not_found")
            )
        if self.command not in allowed:
            return self._error(
                RequestError(
                    405, f"{path} answers {', '.join(allowed)}, not {self.command}", code="method_not_allowed"
                ),
                {"Allow": ", ".join(allowed)},
            )
        if path == "/health":
            return self._send(200, {"status": "ok"})
        if path == "/v1/models":
            return self._send(200, app.models())
        if model_id is not None:
            if model_id != app.model_name:
                return self._error(
                    RequestError(
                        404,
                        f"the model {model_id!r} does not exist; this server serves {app.model_name!r}",
                        "model",
                        "model_not_found",
                    )
                )
            return self._send(200, app.model_card())
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            return self._error(RequestError(400, f"the body is not valid JSON: {e}"))
        try:
            req, out = app.complete(body, "chat" if path == "/v1/chat/completions" else "text")
        except RequestError as e:
            return self._error(e)
        except Exception as e:  # answer rather than drop the connection (a client would retry a drop)
            return self._error(RequestError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error"))
        if req.stream:
            self._sse(out)
        else:
            self._send(200, out)

    def __getattr__(self, name: str):
        # every method (GET, POST, DELETE, OPTIONS, any other word) goes through _route, which
        # answers 404 / 405 in JSON, where the base class would send a 501 page
        if name.startswith("do_"):
            return self._route
        raise AttributeError(name)
