"""The Starlette application: authentication, limits, the two endpoints, streaming.

Every request needs the bearer key (compared in constant time; a wrong key is never
logged). Bodies are read with a size limit and a deadline, so a slow or huge upload costs a
connection, not the server. Work goes to the core's lane; a full queue is 429 with
Retry-After, and a client that closes its connection cancels its request (a queued one never
runs, a streaming one stops at the next token). The access log holds times, sizes and
status codes only: never a request's words, a reply or a key.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from galahad_desktop.errors import CancelledError, ContextFullError, GalahadError, InputError
from galahad_desktop.jobs import Job
from galahad_desktop.memory.results import ChatCompletion
from galahad_desktop.server import protocol
from galahad_desktop.server.lane import CoreLane
from galahad_desktop.server.protocol import ApiError

access_log = logging.getLogger("galahad.server.access")


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 4 * 1024 * 1024
    body_timeout_s: float = 30.0  # the whole body must arrive within this
    head_timeout_s: float = 10.0  # a request's head (line and headers) must arrive within this
    queue_limit: int = 8  # requests queued or running before 429
    retry_after_s: int = 5
    max_tokens: int = 32_768
    max_connections: int = 256  # open at once (past it: 429); well under 1,024 open files
    max_waiting_heads: int = 64  # connections yet to send a request head (the oldest goes)


@dataclass(frozen=True)
class ServerIdentity:
    model: str  # the id /v1/models lists (the model file's name)
    key: Callable[[], str]  # the bearer key now (rotating it takes effect at once)
    created: int = 0
    context_length: int = 0  # the loaded context's tokens (0: not known)


def _error(exc: ApiError) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
    if exc.status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def _core_error(exc: BaseException) -> ApiError:
    """A failure in the core, as OpenAI's clients expect it (never a traceback)."""
    if isinstance(exc, ContextFullError) or (isinstance(exc, InputError) and "context" in str(exc)):
        return ApiError(400, str(exc), "messages", "context_length_exceeded")
    if isinstance(exc, InputError):  # a refusal that names its field says which
        return ApiError(400, str(exc), getattr(exc, "param", None))
    if isinstance(exc, GalahadError):
        return ApiError(500, str(exc), kind="server_error", code=type(exc).__name__)
    return ApiError(
        500,
        f"Internal error ({type(exc).__name__}); nothing stored was changed by it.",
        kind="server_error",
    )


class GalahadApi:
    def __init__(self, lane: CoreLane, identity: ServerIdentity, limits: Limits) -> None:
        self.lane = lane
        self.identity = identity
        self.limits = limits

    # -- the checks every request passes ---------------------------------------------------
    def authenticate(self, request: Request) -> None:
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        expected = self.identity.key()
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), expected.encode()
        ):
            raise ApiError(
                401,
                "Incorrect or missing API key. The key is shown by 'galahad serve --show-key' "
                "and in the window's Local server panel.",
                code="invalid_api_key",
            )

    async def body(self, request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and (
            not declared.isdigit() or int(declared) > self.limits.max_body_bytes
        ):
            raise ApiError(413, f"The request body is over {self.limits.max_body_bytes:,} bytes.")
        data = bytearray()

        async def read() -> None:
            async for piece in request.stream():
                data.extend(piece)
                if len(data) > self.limits.max_body_bytes:
                    raise ApiError(
                        413, f"The request body is over {self.limits.max_body_bytes:,} bytes."
                    )

        try:
            await asyncio.wait_for(read(), self.limits.body_timeout_s)
        except TimeoutError:
            raise ApiError(
                408, f"The request body did not arrive within {self.limits.body_timeout_s:g} s."
            ) from None
        try:
            return json.loads(bytes(data), parse_int=_bounded_int)
        except RecursionError:
            raise ApiError(400, "The request body is nested too deeply to read.") from None
        except _HugeInteger as exc:
            raise ApiError(400, str(exc)) from None
        except ValueError as exc:  # not JSON, not UTF-8
            raise ApiError(400, f"The request body is not valid JSON ({exc}).") from None

    def admit(self) -> None:
        if self.lane.waiting() >= self.limits.queue_limit:
            raise ApiError(
                429,
                f"{self.limits.queue_limit} requests are already waiting for the model; "
                "try again shortly.",
                kind="rate_limit_error",
                code="queue_full",
                retry_after=self.limits.retry_after_s,
            )

    # -- endpoints -------------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        self.authenticate(request)
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.identity.model,
                        "object": "model",
                        "created": self.identity.created,
                        "owned_by": "galahad",
                        **(
                            {"context_length": self.identity.context_length}
                            if self.identity.context_length
                            else {}
                        ),
                    }
                ],
            }
        )

    async def health(self, request: Request) -> Response:
        """Whether the server answers (no key needed: it says nothing else)."""
        return JSONResponse({"status": "ok"})

    async def chat(self, request: Request) -> Response:
        self.authenticate(request)
        self.admit()  # before the body too: a full queue costs no upload
        args = protocol.parse_chat(await self.body(request), self.limits.max_tokens)
        self.admit()
        if args.stream:
            return self._streamed(request, args)
        cancel = threading.Event()
        future = self.lane.submit(
            "API chat",
            lambda core: core.complete_chat(
                args.messages, Job(cancel=cancel), args.stop, args.reply, **args.sampling
            ),
            cancel,
        )
        waiting = asyncio.wrap_future(future)
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=0.25)
            if done:
                break
            if await request.is_disconnected():
                cancel.set()  # the client left: a queued request never runs
        try:
            result: ChatCompletion = waiting.result()
        except BaseException as exc:
            raise _core_error(exc) from None
        ident = protocol.completion_id()
        return JSONResponse(protocol.completion_body(ident, self.identity.model, result))

    def _streamed(self, request: Request, args: protocol.ChatArgs) -> Response:
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        cancel = threading.Event()

        def put(kind: str, value: Any) -> None:
            loop.call_soon_threadsafe(pieces.put_nowait, (kind, value))

        job = Job(on_text=lambda piece: put("text", piece), cancel=cancel)
        future = self.lane.submit(
            "API chat",
            lambda core: core.complete_chat(
                args.messages, job, args.stop, args.reply, **args.sampling
            ),
            cancel,
        )
        future.add_done_callback(lambda f: put("done", f))
        ident, model = protocol.completion_id(), self.identity.model

        def event(body: dict[str, Any]) -> str:
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        async def events() -> AsyncIterator[str]:
            try:
                yield event(protocol.chunk(ident, model, {"role": "assistant", "content": ""}))
                while True:
                    kind, value = await pieces.get()
                    if kind == "text":
                        yield event(protocol.chunk(ident, model, {"content": value}))
                        continue
                    if value.cancelled():
                        return
                    error = value.exception()
                    if error is not None:
                        if not isinstance(error, CancelledError):
                            yield event(_core_error(error).body())
                        break
                    result: ChatCompletion = value.result()
                    if result.calls:  # parsed once the reply has ended: sent whole
                        calls = protocol.tool_calls(result.calls, streamed=True)
                        yield event(protocol.chunk(ident, model, {"tool_calls": calls}))
                    yield event(protocol.chunk(ident, model, {}, result.finish_reason))
                    if args.include_usage:
                        yield event(
                            protocol.chunk(
                                ident, model, {}, with_usage=protocol.usage(result), choices=False
                            )
                        )
                    break
                yield "data: [DONE]\n\n"
            finally:
                cancel.set()  # the client left mid-reply (or it ended): stop at the next token

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


MAX_INTEGER_DIGITS = 1000  # far past any field (int64: 19 digits); fields name their own bounds


class _HugeInteger(ValueError):
    """An integer in a request body with more digits than any field can use."""


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise _HugeInteger(
            f"The request body holds an integer of {len(text.lstrip('-')):,} digits; "
            f"no field takes more than {MAX_INTEGER_DIGITS}."
        )
    return int(text)


LOOPBACK_NAMES = ("localhost", "localhost.")


def host_allowed(header: str, network: bool) -> bool:
    """Whether a request's Host names this server as a loopback client would: `localhost`
    or a loopback address (any IP address when the server is open to the network). A page
    that rebinds its own domain name to 127.0.0.1 sends that name, and is refused."""
    name = header.strip().lower()
    if name.startswith("["):  # [v6]:port
        name = name[1 : name.find("]")] if "]" in name else ""
    elif name.count(":") == 1:
        name, _, port = name.partition(":")
        if not port.isdigit():
            return False
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    return network or address.is_loopback


def build_app(
    lane: CoreLane,
    identity: ServerIdentity,
    limits: Limits | None = None,
    network: bool = False,
) -> Starlette:
    """The application; `network`: the server listens where other computers reach it
    (--allow-network), so a Host naming any IP address is accepted."""
    api = GalahadApi(lane, identity, limits or Limits())

    def guarded(endpoint: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def run(request: Request) -> Response:
            start = time.perf_counter()
            try:
                if not host_allowed(request.headers.get("host", ""), network):
                    raise ApiError(
                        403,
                        "The request's Host header does not name this computer (localhost "
                        "or 127.0.0.1); requests through other names are refused.",
                        code="host_not_allowed",
                    )
                response: Response = await endpoint(request)
            except ApiError as exc:
                response = _error(exc)
            except Exception as exc:  # a bug: OpenAI's shape, by type only, never a traceback
                access_log.warning("internal error (%s)", type(exc).__name__)
                response = _error(_core_error(exc))
            access_log.info(
                "%s %s %d in=%s ms=%.0f",
                request.method,
                request.url.path,
                response.status_code,
                request.headers.get("content-length", "-"),
                (time.perf_counter() - start) * 1e3,
            )
            return response

        return run

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(ApiError(404, f"There is no endpoint {request.url.path}.", code="not_found"))

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return _error(ApiError(405, f"{request.method} is not allowed on {request.url.path}."))

    routes = [
        Route("/health", guarded(api.health), methods=["GET"]),
        Route("/v1/models", guarded(api.models), methods=["GET"]),
        Route("/v1/chat/completions", guarded(api.chat), methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, not_allowed)
    return app
