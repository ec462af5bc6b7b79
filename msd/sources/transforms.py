"""Turning a row group's column into token ids.

Contract of a `Tokenize`: it takes the `pyarrow.Array` of one row group's column (as
`RowGroupReader.read` returns it) and returns one 1-D ``int32`` numpy array of token ids per
row, in row order, exactly ``len(array)`` of them. A null cell yields an empty array. The
arrays may be views into one shared buffer; callers must not write to them.

Kinds (see `msd.recipe.schema.Transform`):

- ``bytes`` on a text column: the UTF-8 bytes are the ids, taken straight from the Arrow
  buffers without decoding any row in Python.
- ``bytes`` on a token column: the stored lists are the ids (must fit in int32).
- ``tokenizer``: a HuggingFace ``tokenizer.json``; its own special tokens are not added (no
  template is applied): ``bos``/``eos`` say what goes around each document.
- ``function``: ``package.module:function`` called per cell with a ``str`` (text column) or
  ``list[int]`` (token column), returning a sequence of ints.

With ``bos``/``eos`` (`msd.recipe.schema.Transform`), `make_transform` puts them around each
row that holds tokens (a row is a document); the pieces of text between an image source's
markers are tokenized without them (``documents=False``), and the sample gets them whole
(`boundaries`).

Every problem a user can fix is raised as `SourceError` when the transform is made.
"""

from __future__ import annotations

import functools
import importlib
import itertools
from collections.abc import Callable
from functools import reduce
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from msd.errors import SourceError
from msd.recipe.schema import Transform

Ids = npt.NDArray[np.int32]
Tokenize = Callable[[pa.Array], list[Ids]]


class FunctionFailed(SourceError):
    """A ``function`` transform raised on a cell; what it raised is the ``__cause__``."""


_INT32 = np.iinfo(np.int32)
_EMPTY: Ids = np.empty(0, dtype=np.int32)
_EMPTY.setflags(write=False)  # shared by every empty row


def make_transform(
    transform: Transform, column_kind: Literal["text", "tokens", "chat"], documents: bool = True
) -> Tokenize:
    """The `Tokenize` for ``transform`` applied to a column of ``column_kind``: each row a
    document with its ``bos``/``eos`` (``documents``), or a piece of one, without them."""
    tokenize = _plain(transform, column_kind)
    bos, eos = boundaries(transform) if documents else (None, None)
    if bos is None and eos is None:
        return tokenize
    return _framed(tokenize, bos, eos)


def boundaries(transform: Transform) -> tuple[int | None, int | None]:
    """The ids of ``transform``'s ``bos`` and ``eos`` (None where unset)."""
    return _token_id(transform, "bos"), _token_id(transform, "eos")


def _plain(transform: Transform, column_kind: Literal["text", "tokens", "chat"]) -> Tokenize:
    if column_kind == "chat":
        raise SourceError(
            "a column of conversations is rendered with its source's chat template, not a "
            "transform alone; give the source a chat section"
        )
    if transform.kind == "bytes":
        return text_bytes if column_kind == "text" else token_lists
    if transform.kind == "tokenizer":
        if column_kind != "text":
            raise SourceError(
                "transform kind 'tokenizer' needs a text_column, not a token_column; "
                "use kind 'bytes' to pass stored token ids through"
            )
        return _tokenizer(transform.path)
    if transform.kind == "function":
        return _function(transform.function, column_kind)
    raise SourceError(
        f"unknown transform kind {transform.kind!r}; use bytes, tokenizer or function"
    )


def _framed(tokenize: Tokenize, bos: int | None, eos: int | None) -> Tokenize:
    """``tokenize`` with ``bos`` before and ``eos`` after each row that holds tokens."""
    head = np.array([] if bos is None else [bos], dtype=np.int32)
    tail = np.array([] if eos is None else [eos], dtype=np.int32)

    def framed(array: pa.Array) -> list[Ids]:
        return [np.concatenate((head, ids, tail)) if len(ids) else ids for ids in tokenize(array)]

    return framed


def _token_id(transform: Transform, which: Literal["bos", "eos"]) -> int | None:
    """The id ``transform.bos`` (or ``eos``) names: an id as it is, a name looked up in the
    transform's tokenizer."""
    value = getattr(transform, which)
    if value is None:
        return None
    if isinstance(value, int):
        if not 0 <= value <= _INT32.max:
            raise SourceError(f"transform.{which} {value} is not a token id (0 .. 2**31 - 1)")
        return value
    if transform.kind != "tokenizer":
        raise SourceError(
            f"transform.{which} {value!r} names a token, which only a tokenizer transform has; "
            "give an id instead"
        )
    found = load_tokenizer(transform.path).token_to_id(value)
    if found is None:
        raise SourceError(
            f"transform.{which}: the tokenizer '{transform.path}' has no token {value!r}; name "
            "one of its special tokens (its tokenizer.json's added_tokens) or give an id"
        )
    return int(found)


def text_bytes(array: pa.Array) -> list[Ids]:
    """UTF-8 bytes of each string as ids, split by the Arrow offsets (no per-row decode)."""
    array = _no_nulls(_text_array(array))
    offsets_type = np.int64 if _is_large(array.type) else np.int32
    _, offsets_buf, data_buf = array.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=offsets_type)
    offsets = offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    )
    values = data[offsets[0] : offsets[-1]].astype(np.int32)
    return _split(values, offsets - offsets[0])


def token_lists(array: pa.Array) -> list[Ids]:
    """Stored integer lists as int32 ids; nulls become empty, out-of-range ids are refused."""
    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        raise SourceError(f"a token column must hold lists of integers, got {array.type}")
    flat = array.flatten()  # honours slicing and skips sub-lists behind null cells
    if flat.null_count:
        raise SourceError(
            "a token column holds null token ids inside a list; drop or fix those rows"
        )
    values = _to_int32(flat.to_numpy(zero_copy_only=False))
    lengths = pc.fill_null(array.value_lengths(), 0).to_numpy(zero_copy_only=False)
    offsets = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))
    return _split(values, offsets)


def _split(values: Ids, offsets: npt.NDArray[np.int64]) -> list[Ids]:
    # Plain slicing: np.split costs several times more per row.
    return [values[start:stop] for start, stop in itertools.pairwise(offsets.tolist())]


def _to_int32(values: npt.NDArray[Any]) -> Ids:
    if not np.issubdtype(values.dtype, np.integer):
        raise SourceError(f"token ids must be integers, got {values.dtype}")
    if values.size and (values.min() < _INT32.min or values.max() > _INT32.max):
        raise SourceError(
            f"token ids {values.min()}..{values.max()} do not fit in int32; "
            "remap the vocabulary below 2**31"
        )
    return values.astype(np.int32)


def _text_array(array: pa.Array) -> pa.Array:
    if not (
        pa.types.is_string(array.type)
        or pa.types.is_large_string(array.type)
        or pa.types.is_binary(array.type)
        or pa.types.is_large_binary(array.type)
    ):
        raise SourceError(f"a text column must hold strings or binary, got {array.type}")
    return array


def _is_large(typ: pa.DataType) -> bool:
    return bool(pa.types.is_large_string(typ) or pa.types.is_large_binary(typ))


def _no_nulls(array: pa.Array) -> pa.Array:
    # A null slot may still span bytes in the data buffer; filling rebuilds the offsets.
    if array.null_count == 0:
        return array
    return pc.fill_null(array, pa.scalar(b"" if _is_binary(array.type) else "", array.type))


def _is_binary(typ: pa.DataType) -> bool:
    return bool(pa.types.is_binary(typ) or pa.types.is_large_binary(typ))


def _strings(array: pa.Array) -> list[str]:
    """The cells as Python strings, nulls as ``""``."""
    return [cell or "" for cell in _text_cells(array)]


def _text_cells(array: pa.Array) -> list[str | None]:
    """The cells as Python strings (nulls as None); binary must be UTF-8."""
    array = _text_array(array)
    if _is_binary(array.type):
        target = pa.large_string() if _is_large(array.type) else pa.string()
        try:
            array = array.cast(target)
        except pa.ArrowInvalid as exc:
            raise SourceError(f"a binary text column is not valid UTF-8 ({exc})") from exc
    return list(array.to_pylist())


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str | None) -> Any:
    """The ``tokenizers.Tokenizer`` of ``path`` (loaded once a process)."""
    if not path:
        raise SourceError("transform kind 'tokenizer' needs a path to a tokenizer.json")
    from tokenizers import Tokenizer  # imported lazily: only tokenizer sources pay for it

    try:
        return Tokenizer.from_file(path)
    except Exception as exc:  # the Rust side raises a bare Exception
        raise SourceError(
            f"cannot load tokenizer '{path}' ({exc}); point transform.path at a "
            "HuggingFace tokenizer.json"
        ) from exc


def _tokenizer(path: str | None) -> Tokenize:
    tokenizer = load_tokenizer(path)

    def tokenize(array: pa.Array) -> list[Ids]:
        encodings = tokenizer.encode_batch(_strings(array), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in encodings]

    return tokenize


def _function(spec: str | None, column_kind: Literal["text", "tokens"]) -> Tokenize:
    fn = load_function(spec)
    cells = _text_cells if column_kind == "text" else _list_cells

    def tokenize(array: pa.Array) -> list[Ids]:
        return [_EMPTY if cell is None else _call(fn, spec, cell) for cell in cells(array)]

    return tokenize


def load_function(spec: str | None) -> Callable[[Any], Any]:
    """Import ``package.module:function`` (the attribute may be dotted, e.g. ``mod:Cls.fn``)."""
    module_name, _, attr = (spec or "").partition(":")
    if not module_name or not attr:
        raise SourceError(
            f"transform.function must look like 'package.module:function', got {spec!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise SourceError(
            f"cannot import module '{module_name}' for transform.function {spec!r} "
            f"({type(exc).__name__}: {exc}); check that it is installed or on PYTHONPATH"
        ) from exc
    try:
        fn = reduce(getattr, attr.split("."), module)
    except AttributeError as exc:
        raise SourceError(
            f"module '{module_name}' has no attribute '{attr}' (transform.function {spec!r}); "
            "check the name after the colon"
        ) from exc
    if not callable(fn):
        raise SourceError(f"transform.function {spec!r} is a {type(fn).__name__}, not callable")
    return fn


def _list_cells(array: pa.Array) -> list[list[int] | None]:
    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        raise SourceError(f"a token column must hold lists of integers, got {array.type}")
    return list(array.to_pylist())


def _call(fn: Callable[[Any], Any], spec: str | None, cell: Any) -> Ids:
    try:
        ids = np.asarray(fn(cell))
    except Exception as exc:
        raise FunctionFailed(
            f"transform.function {spec!r} failed on a cell ({type(exc).__name__}: {exc}); "
            "fix the function or the data"
        ) from exc
    if ids.ndim != 1:
        raise SourceError(
            f"transform.function {spec!r} returned shape {ids.shape}; "
            "it must return a flat sequence of token ids"
        )
    # An empty list comes back as float64; anything else must be integers that fit int32.
    return _EMPTY if ids.size == 0 else _to_int32(ids)
