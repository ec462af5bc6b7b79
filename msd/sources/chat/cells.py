"""One conversation cell to a list of messages (pure; the cell is untrusted and bounded).

A cell is a list of messages in the OpenAI / Hugging Face shape (``{role, content}``, content
a string or a list of ``text`` / ``image`` / ``video`` parts) or the ShareGPT / LLaVA shape
(``{from, value}``); or that list as JSON text (``str`` or UTF-8 ``bytes``); or an object
holding it under ``messages`` or ``conversations``. What cannot be read is a reason, never an
exception: `parse` returns one of the fixed strings below.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

Message = dict[str, Any]

# The reasons a conversation is left out (fixed strings: a loader counts rows by them).
NOT_JSON = "conversation not JSON"
TOO_LARGE = "conversation too large"
TOO_DEEP = "conversation nested too deeply"
NOT_A_LIST = "conversation not a list of messages"
NO_MESSAGES = "no messages"
NOT_A_MESSAGE = "message not an object"
NO_ROLE = "message without a role"
UNKNOWN_ROLE = "unknown role"
NO_CONTENT = "message without content"
WRONG_CONTENT = "content of the wrong type"
UNKNOWN_PART = "unknown content part"
REASONS = (
    NOT_JSON,
    TOO_LARGE,
    TOO_DEEP,
    NOT_A_LIST,
    NO_MESSAGES,
    NOT_A_MESSAGE,
    NO_ROLE,
    UNKNOWN_ROLE,
    NO_CONTENT,
    WRONG_CONTENT,
    UNKNOWN_PART,
)

# Bounds on what a cell may hold: far above any real conversation, low enough that a hostile
# cell costs little before it is refused.
MAX_CHARS = 32 * 2**20  # of all its strings together (and of its JSON text)
MAX_VALUES = 2**20  # lists, objects and scalars
MAX_DEPTH = 32  # a message's tool call arguments sit at depth 6

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function", "ipython"})
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
}
MEDIA = frozenset({"image", "video"})
_LIST_KEYS = ("messages", "conversations")


class Malformed(Exception):
    """Why a cell cannot be used (internal: `parse` returns the reason)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse(cell: object) -> list[Message] | str:
    """The messages of ``cell``, normalized (roles mapped, keys holding None dropped, values
    copied into plain JSON types as transformers does before rendering), or why not."""
    try:
        return _messages(_message_list(_decoded(cell)))
    except Malformed as exc:
        return exc.reason


def with_system(messages: list[Message], system: str | None) -> list[Message]:
    """``messages`` with a system message of ``system`` first, when given and none is there."""
    if system is None or any(m["role"] == "system" for m in messages):
        return messages
    return [{"role": "system", "content": system}, *messages]


def _decoded(cell: object) -> object:
    if isinstance(cell, (bytes, bytearray, memoryview)):
        if len(cell) > 4 * MAX_CHARS:
            raise Malformed(TOO_LARGE)
        try:
            cell = bytes(cell).decode("utf-8")
        except UnicodeDecodeError:
            raise Malformed(NOT_JSON) from None
    if not isinstance(cell, str):
        return cell
    if len(cell) > MAX_CHARS:
        raise Malformed(TOO_LARGE)
    try:
        return json.loads(cell)
    except RecursionError:
        raise Malformed(TOO_DEEP) from None
    except ValueError:
        raise Malformed(NOT_JSON) from None


def _message_list(value: object) -> list[Any]:
    if isinstance(value, Mapping):
        value = next((value[k] for k in _LIST_KEYS if value.get(k) is not None), None)
        if value is None:
            raise Malformed(NO_MESSAGES)
    if not isinstance(value, (list, tuple)):
        raise Malformed(NOT_A_LIST)
    if not value:
        raise Malformed(NO_MESSAGES)
    copied: list[Any] = _Plain().copy(list(value), 0)
    return copied


def _messages(raw: list[Any]) -> list[Message]:
    return [_message(m) for m in raw]


def _message(raw: object) -> Message:
    if not isinstance(raw, dict):
        raise Malformed(NOT_A_MESSAGE)
    message = {k: v for k, v in raw.items() if v is not None}
    if "role" not in message and "from" in message:
        return _sharegpt(message)
    role = message.get("role")
    if role is None:
        raise Malformed(NO_ROLE)
    if not isinstance(role, str) or role not in ROLES:
        raise Malformed(UNKNOWN_ROLE)
    content = message.get("content")
    if content is None:
        if "tool_calls" not in message:  # an assistant's tool call may come without content
            raise Malformed(NO_CONTENT)
    elif isinstance(content, (list, tuple)):
        message["content"] = [_part(p) for p in content]
    elif not isinstance(content, str):
        raise Malformed(WRONG_CONTENT)
    return message


def _sharegpt(message: Message) -> Message:
    role = SHAREGPT_ROLES.get(message["from"]) if isinstance(message["from"], str) else None
    if role is None:
        raise Malformed(UNKNOWN_ROLE)
    value = message.get("value")
    if value is None:
        raise Malformed(NO_CONTENT)
    if not isinstance(value, str):
        raise Malformed(WRONG_CONTENT)
    return {"role": role, "content": value}


def _part(raw: object) -> Message:
    # Keys holding None are dropped in parts too: a Parquet struct column of parts gives every
    # part every field, and a template asking `'image' in part` must not see a text part's.
    if not isinstance(raw, dict):
        raise Malformed(UNKNOWN_PART)
    part = {k: v for k, v in raw.items() if v is not None}
    kind = part.get("type")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise Malformed(WRONG_CONTENT)
    elif not isinstance(kind, str) or kind not in MEDIA:
        raise Malformed(UNKNOWN_PART)
    return part


class _Plain:
    """Copies a decoded value into plain JSON types within the bounds: exact ``str``, ``int``,
    ``float``, ``bool``, None, lists, tuples and dicts; anything else (image bytes, arrays)
    becomes an inert ``"<typename>"``, as transformers shows it to a template."""

    def __init__(self) -> None:
        self.values = 0
        self.chars = 0

    def copy(self, value: Any, depth: int) -> Any:
        self.values += 1
        if self.values > MAX_VALUES:
            raise Malformed(TOO_LARGE)
        kind = type(value)
        if kind is str:  # the common cases first, by exact type: a cell's every value is here
            self.chars += len(value)
            if self.chars > MAX_CHARS:
                raise Malformed(TOO_LARGE)
            return value
        if kind is dict or kind is list:
            return self._container(value, depth + 1)
        if value is None or kind in (int, float, bool):
            return value
        if isinstance(value, str):
            self.chars += len(value)
            if self.chars > MAX_CHARS:
                raise Malformed(TOO_LARGE)
            return str.__str__(value)
        if isinstance(value, (int, float)):  # subclasses (enums, numpy) lose their methods
            return int.__int__(value) if isinstance(value, int) else float.__float__(value)
        if isinstance(value, np.generic):
            return self.copy(value.item(), depth)
        if isinstance(value, (Mapping, list, tuple)):
            return self._container(value, depth + 1)
        return f"<{type(value).__name__}>"

    def _container(self, value: Mapping[Any, Any] | list[Any] | tuple[Any, ...], depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise Malformed(TOO_DEEP)
        if type(value) is dict or isinstance(value, Mapping):
            return {self.copy(k, depth): self.copy(v, depth) for k, v in value.items()}
        items = [self.copy(v, depth) for v in value]
        return items if isinstance(value, list) else tuple(items)
