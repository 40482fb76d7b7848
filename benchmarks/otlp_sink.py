"""An OTLP/HTTP sink that reads and drops what it is sent: the exporters of a traced
benchmark run pay for encoding and posting their batches, and nothing is kept.

Run ``python -m benchmarks.otlp_sink PORT`` (benchmarks.tracing starts it in its own process,
so that its work does not land on the benchmark's event loop).
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Drop(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection per exporter

    def do_POST(self) -> None:
        self.read_body()
        self.acknowledge()

    def read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def acknowledge(self) -> None:
        """OTLP/HTTP's empty success answer."""
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Drop).serve_forever()
