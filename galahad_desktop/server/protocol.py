"""OpenAI's chat-completions shapes: a request checked field by field, replies and errors.

Every problem with a request is an `ApiError` naming the field, in OpenAI's error shape
(`{"error": {"message", "type", "param", "code"}}`) with the status OpenAI uses. Fields
OpenAI defines that change nothing here (`user`, `metadata`, `store`…) are accepted and
ignored; ones that would change the reply and are not supported (`n` > 1, logprobs,
logit_bias, penalties, audio output, the legacy `functions`) are refused by name rather than
silently ignored, and so is a field of the wrong type. `tools`, `tool_choice` and
`response_format` are read into a ReplyShape (the core holds the reply to it by grammar).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from galahad_desktop.memory.results import (
    ChatCompletion,
    ChatMessage,
    ChatRole,
    ReplyShape,
    Tool,
    ToolCall,
)

MAX_STOP = 4  # OpenAI's own limit
MAX_STOP_CHARS = 1_000  # per stop text: held back while a reply streams
ROLE_NAMES: dict[str, ChatRole] = {
    "system": "system",
    "developer": "system",  # OpenAI's newer name for the system role
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
MAX_TOOLS = 128
# Fields that would change the reply, with the value that changes nothing (accepted).
UNSUPPORTED: dict[str, object] = {
    "functions": [],  # the legacy form of `tools`
    "function_call": "none",
    "logprobs": False,
    "top_logprobs": 0,
    "audio": None,
    "logit_bias": {},
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "prediction": None,
}


class ApiError(Exception):
    """A request the server refuses, in OpenAI's terms."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        retry_after: int = 0,
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds, for a 429
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True)
class ChatArgs:
    messages: tuple[ChatMessage, ...]
    stream: bool = False
    include_usage: bool = False
    stop: tuple[str, ...] = ()
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, max_tokens, seed
    reply: ReplyShape = field(default_factory=ReplyShape)


def _number(payload: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ApiError(400, f"'{name}' must be a number.", name)
    if not low <= value <= high:
        raise ApiError(400, f"'{name}' must be between {low:g} and {high:g}.", name)
    return float(value)


def _integer(payload: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"'{name}' must be an integer.", name)
    if not low <= value <= high:
        raise ApiError(400, f"'{name}' must be between {low:,} and {high:,}.", name)
    return value


PICTURE_TYPES = {"image/png": "png", "image/jpeg": "jpeg", "image/webp": "webp", "image/gif": "gif"}
DATA_URL = re.compile(r"^data:(image/[a-z]+);base64,(.*)$", re.DOTALL)


def _picture(part: dict[str, Any], where: str) -> tuple[str, bytes]:
    """An `image_url` part: a data URL (the server fetches nothing from the network)."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str):
        raise ApiError(400, f"{where}.image_url.url must be a string.", where)
    found = DATA_URL.match(url[:64]) and DATA_URL.match(url)
    if not found:
        raise ApiError(
            400,
            f"{where}.image_url.url must be a data: URL (data:image/png;base64,…); this server "
            "fetches nothing from the network.",
            where,
            "unsupported_image_url",
        )
    kind = PICTURE_TYPES.get(found.group(1))
    if kind is None:
        raise ApiError(400, f"{where} is {found.group(1)}; PNG, JPEG, WebP or GIF are read.", where)
    try:
        data = base64.b64decode(found.group(2), validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{where}.image_url.url is not valid base64.", where) from None
    return kind, data


def _content(value: Any, where: str) -> tuple[str, tuple[tuple[str, bytes], ...]]:
    """A message's content: a string, or OpenAI's list of text and image parts."""
    if isinstance(value, str):
        return value, ()
    if isinstance(value, list):
        texts, pictures = [], []
        for number, part in enumerate(value):
            at = f"{where}[{number}]"
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise ApiError(400, f"{at} must be an object with a 'type'.", where)
            if part["type"] == "image_url":
                pictures.append(_picture(part, at))
                continue
            if part["type"] != "text":
                raise ApiError(
                    400,
                    f"{at} is of type '{part['type']}'; this server reads text and image_url "
                    "parts.",
                    where,
                    "unsupported_content",
                )
            if not isinstance(part.get("text"), str):
                raise ApiError(400, f"{at}.text must be a string.", where)
            texts.append(part["text"])
        return "".join(texts), tuple(pictures)
    raise ApiError(400, f"{where} must be a string or a list of content parts.", where)


def _messages(value: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty list.", "messages")
    messages = []
    for number, item in enumerate(value):
        where = f"messages[{number}]"
        if not isinstance(item, dict):
            raise ApiError(400, f"{where} must be an object.", where)
        role = item.get("role")
        if not isinstance(role, str) or role not in ROLE_NAMES:
            raise ApiError(
                400,
                f"{where}.role is {role!r}; it must be one of: system, developer, user, "
                "assistant, tool.",
                f"{where}.role",
            )
        calls = _calls(item.get("tool_calls"), where) if role == "assistant" else ()
        content = item.get("content")
        if content is None and not calls:
            raise ApiError(400, f"{where}.content is missing.", f"{where}.content")
        text, pictures = _content("" if content is None else content, f"{where}.content")
        if pictures and ROLE_NAMES[role] != "user":
            raise ApiError(
                400, f"{where}: only user messages can hold pictures.", f"{where}.content"
            )
        call_id = item.get("tool_call_id", "") if role == "tool" else ""
        if role == "tool" and (not isinstance(call_id, str) or not call_id):
            raise ApiError(
                400, f"{where}.tool_call_id must name the call it answers.", f"{where}.tool_call_id"
            )
        messages.append(ChatMessage(ROLE_NAMES[role], text, pictures, calls, call_id))
    return tuple(messages)


def _calls(value: Any, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's `tool_calls`: each a function call whose arguments are a
    JSON object written as a string (as OpenAI sends them)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ApiError(400, f"{where}.tool_calls must be a list.", f"{where}.tool_calls")
    calls = []
    for number, call in enumerate(value):
        at = f"{where}.tool_calls[{number}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise ApiError(400, f"{at} must be a function call.", at)
        ident, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
        if not isinstance(ident, str) or not isinstance(name, str) or not name:
            raise ApiError(400, f"{at} needs an 'id' and a 'function.name'.", at)
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except (ValueError, RecursionError):
                raise ApiError(
                    400, f"{at}.function.arguments is not valid JSON.", f"{at}.function.arguments"
                ) from None
        if not isinstance(arguments, dict):
            raise ApiError(
                400,
                f"{at}.function.arguments must be a JSON object.",
                f"{at}.function.arguments",
            )
        calls.append(ToolCall(ident, name, arguments))
    return tuple(calls)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, "'stop' must be a string or a list of non-empty strings.", "stop")
    if len(stops) > MAX_STOP:
        raise ApiError(400, f"'stop' can hold at most {MAX_STOP} strings.", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise ApiError(
            400, f"Each 'stop' string can be at most {MAX_STOP_CHARS:,} characters.", "stop"
        )
    return tuple(stops)


def _refuse_unsupported(payload: dict[str, Any]) -> None:
    """Fields this server does not implement: absent, null or their neutral value only
    (`logprobs: false`, `tools: []`…); anything else is refused by name."""
    for name, neutral in UNSUPPORTED.items():
        value = payload.get(name)
        # `0 == False` in Python: a number never stands for a flag here, nor a flag for one.
        if value is None or (
            value == neutral and isinstance(value, bool) == isinstance(neutral, bool)
        ):
            continue
        raise ApiError(400, f"'{name}' is not supported by this server.", name)
    modalities = payload.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise ApiError(400, "'modalities' can only be [\"text\"] here.", "modalities")


def _response_format(value: Any) -> tuple[dict[str, Any] | None, bool]:
    """(the JSON schema, any JSON object) a `response_format` asks for."""
    if value is None:
        return None, False
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None, False
    if kind == "json_object":
        return None, True
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError(
                400,
                "'response_format.json_schema.schema' must be a JSON schema object.",
                "response_format.json_schema.schema",
            )
        return schema, False
    raise ApiError(
        400,
        "'response_format.type' must be text, json_object or json_schema.",
        "response_format",
    )


def _tools(payload: dict[str, Any]) -> tuple[tuple[Tool, ...], str, bool]:
    """(the tools offered, tool_choice, parallel_tool_calls)."""
    value = payload.get("tools")
    if value is not None and not isinstance(value, list):
        raise ApiError(400, "'tools' must be a list of function tools.", "tools")
    tools: list[Tool] = []
    for number, item in enumerate(value or []):
        at = f"tools[{number}]"
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or item.get("type") != "function":
            raise ApiError(400, f"{at} must be {{'type': 'function', 'function': {{…}}}}.", at)
        name, description = function.get("name"), function.get("description", "")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(name, str) or not name:
            raise ApiError(400, f"{at}.function.name must be a non-empty string.", at)
        if not isinstance(description, str) or not isinstance(parameters, dict):
            raise ApiError(
                400, f"{at}.function: description must be a string, parameters an object.", at
            )
        tools.append(Tool(name, description, parameters))
    if len(tools) > MAX_TOOLS:
        raise ApiError(400, f"'tools' can hold at most {MAX_TOOLS} functions.", "tools")
    if len({t.name for t in tools}) != len(tools):
        raise ApiError(400, "Two tools in 'tools' have the same name.", "tools")
    choice = payload.get("tool_choice", "auto" if tools else "none")
    if isinstance(choice, dict):
        function = choice.get("function")
        named = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or not isinstance(named, str):
            raise ApiError(
                400,
                "'tool_choice' must be auto, none, required or "
                "{'type': 'function', 'function': {'name': …}}.",
                "tool_choice",
            )
        if named not in {t.name for t in tools}:
            raise ApiError(
                400, f"'tool_choice' names {named!r}, which is not in 'tools'.", "tool_choice"
            )
        choice = "=" + named
    elif choice not in ("auto", "none", "required"):
        raise ApiError(
            400, "'tool_choice' must be auto, none, required or a function.", "tool_choice"
        )
    if choice == "required" and not tools:
        raise ApiError(400, "'tool_choice' is required but 'tools' is empty.", "tool_choice")
    parallel = payload.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ApiError(400, "'parallel_tool_calls' must be true or false.", "parallel_tool_calls")
    return tuple(tools), str(choice), parallel


def parse_chat(payload: Any, max_tokens_limit: int) -> ChatArgs:
    """A chat-completions request body, checked (ApiError names the first problem)."""
    if not isinstance(payload, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    _refuse_unsupported(payload)
    n = _integer(payload, "n", 1, 128)
    if n not in (None, 1):
        raise ApiError(400, "'n' must be 1: this server writes one reply per request.", "n")
    model = payload.get("model")
    if model is None:  # OpenAI requires it: a client that works here must work there
        raise ApiError(
            400,
            "'model' is missing: name the model (GET /v1/models lists the one this server "
            "runs; any name is answered by it).",
            "model",
        )
    if not isinstance(model, str):
        raise ApiError(400, "'model' must be a string.", "model")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false.", "stream")
    options = payload.get("stream_options")
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object.", "stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise ApiError(
            400,
            "'stream_options.include_usage' must be true or false.",
            "stream_options.include_usage",
        )
    limit = _integer(payload, "max_completion_tokens", 1, max_tokens_limit)
    if limit is None:
        limit = _integer(payload, "max_tokens", 1, max_tokens_limit)
    sampling = {
        "temperature": _number(payload, "temperature", 0.0, 2.0),
        "top_p": _number(payload, "top_p", 0.0, 1.0),
        "max_tokens": limit,
        "seed": _integer(payload, "seed", 0, 2**32 - 1),
    }
    if sampling["top_p"] == 0.0:
        sampling["top_p"] = None  # OpenAI treats 0 as "the most likely token": greedy below
        sampling["temperature"] = 0.0
    schema, json_object = _response_format(payload.get("response_format"))
    tools, choice, parallel = _tools(payload)
    if (schema is not None or json_object) and choice not in ("auto", "none"):
        raise ApiError(
            400,
            "A reply cannot be both a required tool call and 'response_format' JSON.",
            "response_format",
        )
    return ChatArgs(
        _messages(payload.get("messages")),
        stream,
        include_usage,
        _stop(payload.get("stop")),
        {k: v for k, v in sampling.items() if v is not None},
        ReplyShape(schema, json_object, tools, choice, parallel),
    )


def completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


def usage(done: ChatCompletion) -> dict[str, Any]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    }


def tool_calls(calls: tuple[ToolCall, ...], streamed: bool = False) -> list[dict[str, Any]]:
    """The calls as OpenAI writes them: arguments as a JSON string (a streamed delta also
    carries each call's index)."""
    return [
        {
            **({"index": number} if streamed else {}),
            "id": call.id,
            "type": "function",
            "function": {
                "name": call.name,
                "arguments": json.dumps(call.arguments, ensure_ascii=False),
            },
        }
        for number, call in enumerate(calls)
    ]


def completion_body(ident: str, model: str, done: ChatCompletion) -> dict[str, Any]:
    return {
        "id": ident,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": done.text if done.text or not done.calls else None,
                    "refusal": None,  # the spec's field (nullable): this server never refuses
                    "annotations": [],
                    **({"tool_calls": tool_calls(done.calls)} if done.calls else {}),
                },
                "finish_reason": done.finish_reason,
                "logprobs": None,
            }
        ],
        "usage": usage(done),
    }


def chunk(
    ident: str,
    model: str,
    delta: dict[str, Any],
    finish: str | None = None,
    with_usage: dict[str, Any] | None = None,
    choices: bool = True,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        if choices
        else [],
    }
    if with_usage is not None:
        body["usage"] = with_usage
    return body
