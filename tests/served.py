"""A local server on the fake core for the server's tests: the real core, uvicorn and the
official `openai` client (conftest's fixture `serve` starts them)."""

from __future__ import annotations

import http.client
import json
from typing import Any

import openai

from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.server.app import Limits, ServerIdentity
from galahad_desktop.server.lane import ThreadLane
from galahad_desktop.server.running import Address, LocalServer


class Served:
    def __init__(self, core: Galahad, limits: Limits | None = None) -> None:
        self.core = core
        self.lane = ThreadLane(core)
        self.key = self.lane.call(lambda c: c.api_key())
        n_ctx = self.lane.call(lambda c: c.info().n_ctx)
        identity = ServerIdentity("fake-model", lambda: self.key, context_length=n_ctx)
        self.server = LocalServer(self.lane, identity, port=0, limits=limits)
        self.address: Address = self.server.start()
        self.client = openai.OpenAI(base_url=self.address.base_url, api_key=self.key)

    def raw(
        self, method: str, path: str, body: bytes | None = None, key: str | None = None
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.address.port, timeout=10)
        headers = {"Authorization": f"Bearer {self.key if key is None else key}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response.status, json.loads(data or b"{}"), dict(response.getheaders())

    def close(self) -> None:
        self.server.stop()
        self.lane.close()
