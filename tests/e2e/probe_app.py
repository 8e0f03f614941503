"""A tiny HTTP app run inside test envs (``python3 -c <this file>``), stdlib only.

GET /health → 200; GET /files/<name> → the content of /work/<name> (404 when absent);
PUT /files/<name> → writes /work/<name>. Listens on port 8000 (or argv[1]).
"""

import http.server
import os
import sys


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            return self._send(200, b"ok")
        if self.path.startswith("/files/"):
            path = "/work/" + self.path[len("/files/") :]
            if os.path.exists(path):
                with open(path, "rb") as f:
                    return self._send(200, f.read())
        return self._send(404, b"missing")

    def do_PUT(self) -> None:
        size = int(self.headers.get("content-length", 0))
        with open("/work/" + self.path[len("/files/") :], "wb") as f:
            f.write(self.rfile.read(size))
        self._send(201, b"written")

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
http.server.ThreadingHTTPServer(("", port), Handler).serve_forever()
