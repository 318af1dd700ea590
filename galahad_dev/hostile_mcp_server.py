"""A stdio MCP server that misbehaves on purpose (for tests and `eval redteam`), written
without the SDK so that it can send what the SDK would never send:
`python galahad_dev/hostile_mcp_server.py MODE [N]` (it imports nothing of Galahad).

endless      tools/list is answered with a line that never ends
deep N       a tool whose argument schema nests N levels deep
describe N   a tool whose description is N megabytes long
tools N      a list of N tools
parts N      a tools/call result of N text parts
child FILE   a well-behaved server that first starts a background child (its pid in FILE)
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def tool(
    name: str, description: str = "Add.", schema: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "inputSchema": schema or {"type": "object", "properties": {"a": {"type": "integer"}}},
    }


def nested(depth: int) -> str:
    """A schema nesting `depth` objects, as JSON text (json.dumps recurses: it cannot)."""
    return '{"type": "object", "properties": {"x": ' * depth + '{"type": "integer"}' + "}}" * depth


def main() -> None:
    mode = sys.argv[1]
    arg = sys.argv[2] if len(sys.argv) > 2 else "0"
    if mode == "child":
        sleeper = subprocess.Popen(["sleep", "300"], stdout=subprocess.DEVNULL)
        with open(arg, "w") as out:
            out.write(str(sleeper.pid))
    for line in sys.stdin:
        request = json.loads(line)
        method, ident = request.get("method"), request.get("id")
        if ident is None:
            continue  # a notification
        if method == "initialize":
            result = {
                "protocolVersion": request["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }
        elif method == "tools/list" and mode == "endless":
            sys.stdout.write(f'{{"jsonrpc": "2.0", "id": {ident}, "result": {{"tools": [')
            while True:
                sys.stdout.write(json.dumps(tool("add")) + ", " * 1000)
        elif method == "tools/list" and mode == "deep":
            listed = f'{{"tools": [{{"name": "add", "inputSchema": {nested(int(arg))}}}]}}'
            sys.stdout.write(f'{{"jsonrpc": "2.0", "id": {ident}, "result": {listed}}}\n')
            sys.stdout.flush()
            continue
        elif method == "tools/list":
            count = int(arg) if arg.isdigit() else 0
            if mode == "describe":
                tools = [tool("add", "x" * (count * 1024 * 1024))]
            elif mode == "tools":
                tools = [tool(f"t{i}") for i in range(count)]
            else:
                tools = [tool("add")]
            result = {"tools": tools}
        elif method == "tools/call":
            parts = int(arg) if mode == "parts" else 1
            result = {"content": [{"type": "text", "text": "3"}] * parts, "isError": False}
        else:
            send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
            continue
        send({"jsonrpc": "2.0", "id": ident, "result": result})


if __name__ == "__main__":
    main()
