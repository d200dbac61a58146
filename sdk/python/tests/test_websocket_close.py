"""WebSocket close codes reach a client that sends its first frame right after connecting.

Orchard's sync SDK uses websocket-client: it connects, sends its ``init`` frame at once,
then reads. A server that drops the TCP connection right after its Close frame makes
the kernel answer that ``init`` with a reset, and the client then reports a broken pipe
or a reset instead of the close code. The server must complete the closing handshake.
The pause before reading stands for a client that is slow to read (a loaded trainer):
by then a dropped connection has been reset.
"""

from __future__ import annotations

import json
import struct
import time
from typing import Any

import pytest
import websocket  # websocket-client, as Orchard's sync SDK

BUSYBOX = "busybox:latest"
#: An image whose pull fails at once: the sandbox ends ``failed``, never ready.
UNPULLABLE = "127.0.0.1:1/no-such-image:latest"

INIT = json.dumps(
    {
        "type": "init",
        "cmd": ["sh"],
        "env": {},
        "cwd": "/",
        "rows": 24,
        "cols": 80,
        "login_shell": False,
    }
)


def close_code_after_init(server: Any, sandbox_id: str, api_key: str) -> int:
    """Connects as Orchard's sync SDK does, sends init at once, reads the close code."""
    url = server.base_url.replace("http://", "ws://", 1)
    ws = websocket.create_connection(
        f"{url}/sandboxes/{sandbox_id}/exec/pty?api_key={api_key}", timeout=10
    )
    try:
        ws.send(INIT)
        time.sleep(0.5)
        # A second frame, as a client typing at once would: on a reset connection this
        # is where websocket-client raises BrokenPipeError.
        ws.send(json.dumps({"type": "resize", "rows": 30, "cols": 100}))
        while True:
            opcode, data = ws.recv_data(control_frame=True)
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                code: int = struct.unpack("!H", data[:2])[0]
                return code
    finally:
        ws.close()


def test_close_codes_reach_websocket_client(server: Any) -> None:
    with server.http() as http:
        r = http.post("/sandboxes", json={"image": BUSYBOX})
        r.raise_for_status()
        ready = r.json()["sandbox_id"]
        assert http.get(f"/sandboxes/{ready}/wait", params={"timeout": 60}).status_code == 200
        r = http.post("/sandboxes", json={"image": UNPULLABLE})
        r.raise_for_status()
        failed = r.json()["sandbox_id"]
        assert http.get(f"/sandboxes/{failed}/wait", params={"timeout": 60}).status_code >= 400
        try:
            assert close_code_after_init(server, ready, "wrong-key") == 4401
            assert close_code_after_init(server, "no-such-sandbox", server.api_key) == 4404
            assert close_code_after_init(server, failed, server.api_key) == 4409
        finally:
            for sid in (ready, failed):
                http.delete(f"/sandboxes/{sid}")


@pytest.mark.parametrize("frames", [0, 3])
def test_a_terminal_that_ends_still_delivers_its_exit(server: Any, frames: int) -> None:
    # The other direction: the agent ends the terminal; its last frames and close reach
    # websocket-client through the orchestrator's bridge.
    with server.http() as http:
        r = http.post("/sandboxes", json={"image": BUSYBOX})
        r.raise_for_status()
        sid = r.json()["sandbox_id"]
        assert http.get(f"/sandboxes/{sid}/wait", params={"timeout": 60}).status_code == 200
        try:
            url = server.base_url.replace("http://", "ws://", 1)
            ws = websocket.create_connection(
                f"{url}/sandboxes/{sid}/exec/pty?api_key={server.api_key}", timeout=10
            )
            init = json.loads(INIT)
            init["cmd"] = ["sh", "-c", "echo bye; exit 7"]
            ws.send(json.dumps(init))
            for _ in range(frames):
                ws.send(json.dumps({"type": "resize", "rows": 30, "cols": 100}))
            seen = []
            while True:
                opcode, data = ws.recv_data(control_frame=True)
                if opcode == websocket.ABNF.OPCODE_CLOSE:
                    break
                seen.append(json.loads(data))
            ws.close()
            assert {"type": "exit", "code": 7} in seen, seen
        finally:
            http.delete(f"/sandboxes/{sid}")
