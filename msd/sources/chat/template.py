"""A Hugging Face chat template: where it is kept, and rendering it as transformers 5 does.

The template is compiled once in a sandbox (`jinja2.sandbox.ImmutableSandboxedEnvironment`)
set up as ``apply_chat_template`` sets up its own: ``trim_blocks``, ``lstrip_blocks``, loop
controls, a ``tojson`` filter that does not escape HTML, ``raise_exception``,
``strftime_now``, a restricted ``dict`` and a ``namespace`` that refuses underscore names; and
``{% generation %}...{% endgeneration %}``, whose output is recorded as a span of characters of
the rendered text. It sees the messages, the special tokens (``bos_token``, ``eos_token``, ...),
``tools`` and ``documents`` None and ``add_generation_prompt`` false.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from msd.errors import SourceError
from msd.sources.chat.cells import Message

Span = tuple[int, int]  # [start, end) characters of the rendered text

_REASONING = ("reasoning_content", "thinking", "reasoning")  # the first is what templates read


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template's Jinja source and the special tokens it sees (e.g. ``bos_token``)."""

    source: str
    special_tokens: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, where: str | os.PathLike[str]) -> ChatTemplate:
        """The template at ``where``: a ``tokenizer_config.json`` (or the folder holding it),
        a ``.jinja`` file, or the template itself (a string holding ``{%`` or ``{{``)."""
        text = os.fspath(where)
        if isinstance(where, str) and ("{%" in text or "{{" in text):
            return cls(text)
        path = Path(text)
        if path.is_dir():
            path = path / "tokenizer_config.json"
        if path.suffix == ".json":
            return _from_config(path)
        return cls(_read(path))


def _from_config(path: Path) -> ChatTemplate:
    try:
        config = json.loads(_read(path))
    except ValueError as exc:
        raise SourceError(f"chat template file '{path}' is not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise SourceError(f"chat template file '{path}' does not hold a JSON object")
    source = config.get("chat_template")
    beside = path.with_name("chat_template.jinja")
    if source is None and beside.is_file():  # where transformers 5 saves it
        source = _read(beside)
    if isinstance(source, list):
        source = _default_of(source, path)
    if not isinstance(source, str):
        raise SourceError(
            f"'{path}' holds no chat_template string; point the source at the model's "
            "tokenizer_config.json or its .jinja template"
        )
    return ChatTemplate(source, special_tokens_of(config))


def _default_of(named: list[Any], path: Path) -> Any:
    """The ``default`` of a list of ``{name, template}``."""
    templates = {t.get("name"): t.get("template") for t in named if isinstance(t, dict)}
    if "default" not in templates:
        names = ", ".join(sorted(str(n) for n in templates))
        raise SourceError(
            f"'{path}' names its chat templates ({names}) but none 'default'; save the one to "
            "use as a .jinja file and point the source at it"
        )
    return templates["default"]


def special_tokens_of(config: Mapping[str, Any]) -> dict[str, str]:
    """The special tokens a template sees, from a ``tokenizer_config.json``: each ``*_token``
    key (a string or an AddedToken object), and the named ``extra_special_tokens``."""
    tokens = {k: _token_text(v) for k, v in config.items() if k.endswith("_token")}
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):
        tokens.update({str(k): _token_text(v) for k, v in extra.items()})
    return {k: v for k, v in tokens.items() if v is not None}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read chat template '{path}' ({exc})") from None


class _Output:
    """What a render wrote so far: its length, and the generation spans recorded."""

    __slots__ = ("length", "spans")

    def __init__(self) -> None:
        self.length = 0
        self.spans: list[Span] = []


_OUTPUT: ContextVar[_Output | None] = ContextVar("msd_chat_output", default=None)
_GENERATED = "_generated"


class _Generation(Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body and records where it went.
    The start is the length written before the block is evaluated, as transformers counts
    it (inside a macro or a ``set`` block that is not where the text lands: the same spans)."""

    tags = {"generation"}  # noqa: RUF012 (the type jinja declares)

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method(_GENERATED, [], lineno=lineno)
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _generated(self, caller: Callable[[], str]) -> str:
        text = caller()
        output = _OUTPUT.get()
        if output is not None:
            output.spans.append((output.length, output.length + len(text)))
        return text


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters; templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _Dict:
    """``dict(...)`` and ``dict.fromkeys`` for templates, without the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Any, value: Any = None) -> dict[Any, Any]:
        return dict.fromkeys(keys, value)


def _check_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a namespace cannot hold {name!r}")


class _Namespace(Namespace):
    """Jinja's namespace, refusing attributes that start with an underscore."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        Namespace.__setitem__(self, name, value)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
        dict=_Dict(),
        namespace=_Namespace,
    )
    return env


class CompiledTemplate:
    """A `ChatTemplate` compiled once; `render` turns messages into text and generation spans."""

    def __init__(self, template: ChatTemplate) -> None:
        env = _environment()
        try:
            tree = env.parse(template.source)
        except jinja2.TemplateSyntaxError as exc:
            raise SourceError(
                f"the chat template does not compile ({exc.message}, line {exc.lineno}); "
                "fix the template"
            ) from None
        self.has_generation = any(_is_generation(b) for b in tree.find_all(nodes.CallBlock))
        self._template = env.from_string(tree)
        # What `Template.generate` would merge for every render, merged once: the globals (a
        # ChainMap, slow to copy) and the variables every conversation sees.
        self._variables: dict[str, Any] = {
            **self._template.globals,
            **template.special_tokens,
            "tools": None,
            "documents": None,
            "add_generation_prompt": False,
        }

    def render(self, messages: list[Message]) -> tuple[str, list[Span]]:
        """The rendered text and its generation spans; raises what the template raises."""
        output = _Output()
        blocks: list[str] = []
        token = _OUTPUT.set(output)
        try:
            for block in self._blocks([_with_reasoning(m) for m in messages]):
                blocks.append(block)
                output.length += len(block)
        finally:
            _OUTPUT.reset(token)
        return "".join(blocks), output.spans

    def _blocks(self, messages: list[Message]) -> Iterator[str]:
        variables = {**self._variables, "messages": messages}
        context = self._template.new_context(variables, shared=True)
        return self._template.root_render_func(context)


def _is_generation(block: nodes.CallBlock) -> bool:
    call = block.call
    return isinstance(call.node, nodes.ExtensionAttribute) and call.node.name == _GENERATED


def _with_reasoning(message: Message) -> Message:
    """A message's reasoning under each name templates read it by (as transformers does)."""
    reasoning = next((message[k] for k in _REASONING if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}
