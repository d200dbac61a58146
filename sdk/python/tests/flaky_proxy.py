"""A small HTTP proxy that misbehaves on purpose, for the retry tests.

It forwards requests to the real server, except those matched by a rule, which get:

- ``"drop"``: the connection is closed after the request was read, nothing forwarded
  (the client cannot tell whether the server got it);
- ``"drop_after"``: the request is forwarded and answered by the server, then the
  connection is closed without the answer (the server did the work);
- ``"503"``: a 503 answer, nothing forwarded.

Rules are used once each, in order. Its socket is bound at once but listens only when
:meth:`listen` is called, so until then connecting is refused (a ``ConnectError``).
"""

from __future__ import annotations

import http.client
import socket
import threading
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class Rule:
    """Misbehave once on the next ``method`` request whose path starts with ``prefix``."""

    method: str
    prefix: str
    action: str


@dataclass
class FlakyProxy:
    upstream: str
    rules: list[Rule] = field(default_factory=list)
    #: (method, path, action) of every request seen, in order.
    seen: list[tuple[str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()  # protects rules and seen (one thread per connection)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._listening = False
        self._closed = False
        up = urlsplit(self.upstream)
        self._up = (up.hostname or "127.0.0.1", up.port or 80)

    def add(self, method: str, prefix: str, action: str, times: int = 1) -> None:
        with self._lock:
            self.rules.extend(Rule(method, prefix, action) for _ in range(times))

    def count(self, method: str, prefix: str) -> int:
        with self._lock:
            return sum(1 for m, p, _ in self.seen if m == method and p.startswith(prefix))

    def listen(self) -> None:
        if self._listening:
            return
        self._listening = True
        self._sock.listen(128)
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self._sock.close()

    def _action(self, method: str, path: str) -> str:
        with self._lock:
            for i, rule in enumerate(self.rules):
                if rule.method == method and path.startswith(rule.prefix):
                    del self.rules[i]
                    self.seen.append((method, path, rule.action))
                    return rule.action
            self.seen.append((method, path, "pass"))
            return "pass"

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            while True:
                line = reader.readline()
                if not line:
                    return
                method, target, _ = line.decode().split(" ", 2)
                headers: list[tuple[str, str]] = []
                length = 0
                while (h := reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, value = h.decode().split(":", 1)
                    headers.append((name.strip(), value.strip()))
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = reader.read(length) if length else b""
                action = self._action(method, target)
                if action == "drop":
                    return
                if action == "503":
                    payload = b'{"detail": "overloaded (test proxy)", "code": "unavailable"}'
                    conn.sendall(
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                        + b"Retry-After: 0\r\n"
                        + f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                        + payload
                    )
                    return
                status, reason, resp_headers, resp_body = self._forward(
                    method, target, headers, body
                )
                if action == "drop_after":
                    return
                out = [f"HTTP/1.1 {status} {reason}\r\n".encode()]
                for name, value in resp_headers:
                    if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                        out.append(f"{name}: {value}\r\n".encode())
                out.append(f"Content-Length: {len(resp_body)}\r\n\r\n".encode())
                conn.sendall(b"".join(out) + resp_body)
        except (OSError, ValueError):
            return
        finally:
            reader.close()
            conn.close()

    def _forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        up = http.client.HTTPConnection(*self._up, timeout=600)
        try:
            up.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                if name.lower() not in ("connection", "keep-alive"):
                    up.putheader(name, value)
            up.putheader("Connection", "close")
            up.endheaders(body or None)
            resp = up.getresponse()
            return resp.status, resp.reason, resp.getheaders(), resp.read()
        finally:
            up.close()
