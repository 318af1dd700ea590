"""An MCP server written with the official SDK, run in a subprocess by the tool tests:
`python tests/mcp_tools_server.py` serves stdio; `... http PORT` streamable HTTP."""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("galahad-test-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@server.tool()
def hang(seconds: float) -> str:
    """Wait this many seconds, then say so."""
    time.sleep(seconds)
    return f"waited {seconds} s"


@server.tool()
def shout(megabytes: int) -> str:
    """Write this many megabytes to stderr, then answer (a server that logs without end)."""
    line = "x" * 1023 + "\n"
    for _ in range(megabytes * 1024):
        sys.stderr.write(line)
    sys.stderr.flush()
    return "said it all"


@server.tool()
def crash() -> str:
    """Stop the server at once (as a crash would)."""
    sys.stderr.write("test server: crashing on purpose\n")
    sys.stderr.flush()
    os._exit(3)


@server.tool()
def fail(reason: str) -> str:
    """Fail with the reason given (a failure the tool expected: the model reads it)."""
    raise ToolError(reason)


def serve_http(port: int, token: str) -> None:
    """Streamable HTTP on 127.0.0.1; with a token, a request without `Authorization:
    Bearer TOKEN` is answered 401 (as a hosted server that needs a key would)."""
    import uvicorn

    app = server.streamable_http_app()

    async def guarded(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
        headers = dict(scope.get("headers") or [])
        if (
            scope["type"] == "http"
            and token
            and headers.get(b"authorization") != (b"Bearer " + token.encode())
        ):
            await send({"type": "http.response.start", "status": 401, "headers": []})  # type: ignore[operator]
            await send({"type": "http.response.body", "body": b"unauthorized"})  # type: ignore[operator]
            return
        await app(scope, receive, send)  # type: ignore[arg-type]

    uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "http":
        serve_http(int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "")
    else:
        server.run()
