"""An HTTP endpoint for the tests that answers every POST with 200 and keeps it: the webhook
behind Alertmanager, or the pager bridge's webhook sink."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Hit:
    headers: dict[str, str]
    body: bytes


class Receiver:
    def __init__(self) -> None:
        self.hits: list[Hit] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    outer.hits.append(Hit(dict(self.headers.items()), body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def documents(self) -> list[Any]:
        return [json.loads(h.body) for h in list(self.hits)]

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert of every Alertmanager notification received."""
        return [alert for doc in self.documents() for alert in doc["alerts"]]

    def notifications(self, finding_id: str) -> list[dict[str, Any]]:
        """Alertmanager's notifications of the group of one finding (group_by finding_id)."""
        return [n for n in self.documents() if n["groupLabels"].get("finding_id") == finding_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
