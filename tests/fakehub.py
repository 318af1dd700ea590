"""A tiny fake Hugging Face Hub on loopback: HEAD/GET for one repo, Range, interruptions."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeHub:
    def __init__(
        self,
        repo: str,
        filename: str,
        content: bytes,
        advertised_sha: str | None = None,
        more: dict[str, bytes] | None = None,  # other files of the same repository
    ) -> None:
        self.repo, self.filename, self.content = repo, filename, content
        self.sha = advertised_sha or hashlib.sha256(content).hexdigest()
        self.files = {filename: (content, self.sha)}
        for name, data in (more or {}).items():
            self.files[name] = (data, hashlib.sha256(data).hexdigest())
        self.ranges: list[str | None] = []
        self.drop_after: int | None = None  # close the connection after this many bytes, once
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _ours(self) -> tuple[bytes, str] | None:
                prefix = f"/{hub.repo}/resolve/main/"
                path = self.path.split("?")[0]
                if not path.startswith(prefix):
                    return None
                return hub.files.get(path[len(prefix) :])

            def do_HEAD(self) -> None:
                found = self._ours()
                if found is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.end_headers()
                    return
                content, sha = found
                self.send_response(200)
                self.send_header("X-Repo-Commit", "a" * 40)
                self.send_header("ETag", f'"{sha}"')
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(content)))
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()

            def do_GET(self) -> None:
                found = self._ours()
                if found is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                content = found[0]
                wanted = self.headers.get("Range")
                hub.ranges.append(wanted)
                start = int(wanted.split("=")[1].split("-")[0]) if wanted else 0
                body = content[start:]
                self.send_response(206 if wanted else 200)
                if wanted:
                    self.send_header(
                        "Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}"
                    )
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if hub.drop_after is not None:
                    cut, hub.drop_after = hub.drop_after, None
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # A short poll: shutting the server down waits one poll interval (0.5 s by default).
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
