"""Conversations rendered and tokenized by msd equal transformers' ``apply_chat_template``.

A tiny BPE tokenizer is trained here and saved as ``tokenizer.json``; msd reads it with
``tokenizers`` and transformers with ``PreTrainedTokenizerFast`` from the same file. The
templates are written in the style of published ones (ChatML / Qwen2-VL with a default system
prompt, Llama-3 role headers), with ``{% generation %}`` around each reply and its end token.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from msd.errors import SourceError
from msd.sources.chat import ChatTemplate, Conversations, Rendered, cells, conversations, parse

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<image>",
    "<video>",
]
BOS, EOS = "<|begin_of_text|>", "<|endoftext|>"
TOKENS = {"bos_token": BOS, "eos_token": EOS}
CORPUS = [
    "You are a helpful assistant. Hello! How are you today?",
    "I am fine, thank you. What is in this picture? A cat sitting on a mat.",
    "Describe the video: a dog runs across the green field, then jumps over the fence.",
    'The weather in Paris is {"city": "Paris", "unit": "celsius"} sunny and 21 degrees.',
    "user assistant system tool reasoning: first think, then answer. 1 + 1 = 2\n\n",
]

# Qwen2-VL style: a default system prompt, image and video parts as pads between vision
# tokens, tool calls as JSON, each reply and its <|im_end|> a generation block.
CHATML = """
{%- macro content(c) -%}
{%- if c is string -%}{{ c }}
{%- else -%}{%- for part in c -%}
{%- if part.type == 'image' or 'image' in part -%}<|vision_start|><|image_pad|><|vision_end|>
{%- elif part.type == 'video' -%}<|vision_start|><|video_pad|><|vision_end|>
{%- else -%}{{ part.text }}{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- if messages[0].role != 'system' -%}
<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif -%}
{%- for message in messages -%}
<|im_start|>{{ message.role }}
{% if message.role == 'assistant' -%}
{%- generation -%}
{%- if message.reasoning_content is defined -%}<think>{{ message.reasoning_content }}</think>
{%- endif -%}
{{- content(message.content) -}}
{%- for call in message.tool_calls | default([]) -%}
<tool_call>{{ call.function | tojson }}</tool_call>
{%- endfor -%}
<|im_end|>
{%- endgeneration %}

{% else -%}
{{ content(message.content) }}<|im_end|>
{% endif -%}
{%- endfor -%}
"""

# Llama-3 style: bos, role headers, trimmed content, <|eot_id|>; an image part is <image>.
LLAMA3 = """
{%- macro content(c) -%}
{%- if c is string -%}{{ c | trim }}
{%- else -%}{%- for part in c -%}
{%- if part.type == 'image' -%}{{ '<image>' }}
{%- elif part.type == 'video' -%}{{ '<video>' }}
{%- else -%}{{ part.text | trim }}{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{{- bos_token }}
{%- set ns = namespace(turns=0) %}
{%- for message in messages %}
{%- if message.role not in ['system', 'user', 'assistant'] %}
{{- raise_exception('Only system, user and assistant roles are supported!') }}
{%- endif %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' }}
{%- if message.role == 'assistant' %}
{%- set ns.turns = ns.turns + 1 %}
{%- generation %}{{- content(message.content) + '<|eot_id|>' }}{%- endgeneration %}
{%- else %}
{{- content(message.content) + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
"""

# Zephyr style: no generation blocks.
ZEPHYR = """
{%- for message in messages %}
{{- '<|' + message.role + '|>\n' + message.content + eos_token + '\n' }}
{%- endfor %}
"""

# Plain ChatML, whose text the property test writes out itself.
SIMPLE = """
{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\n' }}
{%- if message.role == 'assistant' %}
{%- generation %}{{ message.content + '<|im_end|>' }}{% endgeneration %}
{{- '\n' }}
{%- else %}
{{- message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
"""

# A generation block rendered into a `set` block and written later: its span is recorded where
# the output stood when it ran, so the spans end out of order (transformers keeps them so).
CAPTURED = """
{%- set first %}{% generation %}{{ messages[-1].content }} and more{% endgeneration %}{% endset %}
{%- for message in messages %}{{ message.role }}: {% generation %}{{ message.content }}
{%- endgeneration %}{{ eos_token }}{% endfor %}{{ first }}
"""

# The sandbox's helpers: strftime_now, dict, tojson's options, namespace, loop controls.
HELPERS = """
{%- set ns = namespace(n=0) %}
{%- for message in messages %}{% if loop.index > 3 %}{% break %}{% endif %}
{%- set ns.n = ns.n + 1 %}
{{- message.role }}: {{ dict(text=message.content, n=ns.n) | tojson(sort_keys=True, indent=1) }}
{%- if message.role == 'assistant' %}{% generation %}{{ eos_token }}{% endgeneration %}{% endif %}
{%- endfor %}{{ strftime_now('%Y') | length }}
"""


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


@pytest.fixture(scope="module")
def hf(tokenizer_file: Path) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file), **TOKENS)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_file: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tokenizer_file))


def msd_chat(tokenizer: Tokenizer, template: str, **options: Any) -> Conversations:
    return Conversations(ChatTemplate(template, TOKENS), tokenizer, **options)


def transformers_chat(
    hf: PreTrainedTokenizerFast, template: str, messages: list[dict[str, Any]]
) -> tuple[list[int], list[bool]]:
    out = hf.apply_chat_template(
        copy.deepcopy(messages),
        chat_template=template,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]


def rendered(result: Rendered | str) -> Rendered:
    assert not isinstance(result, str), result
    return result


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


SYSTEM = {"role": "system", "content": "You are a terse assistant."}
SINGLE = [user("Hello! How are you today?"), assistant("I am fine, thank you.")]
MULTI = [
    user("What is in this picture?"),
    assistant("A cat sitting on a mat."),
    user("And the weather in Paris?"),
    assistant("  Sunny and 21 degrees.  "),
]
PARTS = [
    user([{"type": "text", "text": "Describe "}, {"type": "text", "text": "the field."}]),
    assistant([{"type": "text", "text": "A dog runs across the green field."}]),
]
TOOL_CALL = [
    user("The weather in Paris?"),
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "content": "sunny, 21"},
    assistant("Sunny and 21 degrees."),
]
REASONING = [user("1 + 1?"), {"role": "assistant", "content": "2", "reasoning": "first think"}]

TEXT_CASES = {
    "chatml-single": (CHATML, SINGLE),
    "chatml-multi": (CHATML, MULTI),
    "chatml-system": (CHATML, [SYSTEM, *MULTI]),
    "chatml-parts": (CHATML, PARTS),
    "chatml-tool-call": (CHATML, TOOL_CALL),
    "chatml-reasoning": (CHATML, REASONING),
    "llama3-single": (LLAMA3, SINGLE),
    "llama3-multi": (LLAMA3, MULTI),
    "llama3-system": (LLAMA3, [SYSTEM, *MULTI]),
    "llama3-parts": (LLAMA3, PARTS),
    "captured-spans": (CAPTURED, MULTI),
    "helpers": (HELPERS, [SYSTEM, *MULTI]),
}


@pytest.mark.parametrize("case", TEXT_CASES)
def test_ids_and_trained_tokens_equal_transformers(case, hf, tokenizer):
    template, messages = TEXT_CASES[case]
    ids, mask = transformers_chat(hf, template, messages)
    result = rendered(msd_chat(tokenizer, template, markers=("", "")).render(messages))
    assert result.ids.dtype == np.int32 and result.trained.dtype == np.bool_
    assert result.ids.tolist() == ids
    assert result.trained.tolist() == mask
    assert result.media == () and len(result.segments) == 1
    assert 0 < sum(mask) < len(mask)


@pytest.mark.parametrize("template", [CHATML, LLAMA3], ids=["chatml", "llama3"])
def test_a_system_prompt_goes_first_unless_the_conversation_has_one(template, hf, tokenizer):
    chat = msd_chat(tokenizer, template, system=SYSTEM["content"])
    ids, mask = transformers_chat(hf, template, [SYSTEM, *MULTI])
    result = rendered(chat.render(MULTI))
    assert (result.ids.tolist(), result.trained.tolist()) == (ids, mask)
    own = {"role": "system", "content": "Answer in French."}
    ids, mask = transformers_chat(hf, template, [own, *MULTI])
    result = rendered(chat.render([own, *MULTI]))
    assert (result.ids.tolist(), result.trained.tolist()) == (ids, mask)


def test_every_cell_form_gives_the_same_conversation(tokenizer):
    chat = msd_chat(tokenizer, CHATML)
    sharegpt = [{"from": "human", "value": MULTI[0]["content"]}] + [
        {"from": "gpt" if m["role"] == "assistant" else "user", "value": m["content"]}
        for m in MULTI[1:]
    ]
    forms = [
        MULTI,
        tuple(MULTI),
        json.dumps(MULTI),
        json.dumps(MULTI).encode(),
        {"messages": MULTI, "id": 7},
        {"conversations": sharegpt},
        sharegpt,
        [{**m, "name": None} for m in MULTI],  # keys holding null are dropped
    ]
    expected = rendered(chat.render(MULTI))
    for form in forms:
        result = rendered(chat.render(form))
        assert result.ids.tolist() == expected.ids.tolist(), form
        assert result.trained.tolist() == expected.trained.tolist(), form


MEDIA_CASES = {
    # template, markers, msd's cell, what transformers is given, media kinds
    "chatml-image-part": (
        CHATML,
        ("<|image_pad|>", "<|video_pad|>"),
        [
            user(
                [
                    {"type": "image", "path": "a.jpg"},
                    {"type": "text", "text": "What is in this picture?"},
                ]
            ),
            assistant("A cat."),
        ],
        None,
        ("image",),
    ),
    "chatml-image-and-video": (
        CHATML,
        ("<|image_pad|>", "<|video_pad|>"),
        [
            user([{"type": "text", "text": "Describe "}, {"type": "video", "url": "v.mp4"}]),
            assistant("A dog runs."),
            user([{"type": "image"}, {"type": "image"}, {"type": "text", "text": "and these?"}]),
            assistant("A cat sitting on a mat."),
        ],
        None,
        ("video", "image", "image"),
    ),
    "llama3-image-part": (
        LLAMA3,
        ("<image>", "<video>"),
        [
            SYSTEM,
            user([{"type": "text", "text": "What is this?"}, {"type": "image"}]),
            assistant("A cat."),
        ],
        None,
        ("image",),
    ),
    "sharegpt-image": (
        CHATML,
        ("<image>", "<video>"),
        [
            {"from": "human", "value": "<image>\nWhat is in this picture?"},
            {"from": "gpt", "value": "A cat on a mat."},
        ],
        [user("<image>\nWhat is in this picture?"), assistant("A cat on a mat.")],
        ("image",),
    ),
    "sharegpt-video-then-image": (
        LLAMA3,
        ("<image>", "<video>"),
        [
            {"from": "system", "value": "Be terse."},
            {"from": "human", "value": "<video> Describe the video, then <image>"},
            {"from": "gpt", "value": "A dog runs across the field."},
        ],
        [
            {"role": "system", "content": "Be terse."},
            user("<video> Describe the video, then <image>"),
            assistant("A dog runs across the field."),
        ],
        ("video", "image"),
    ),
}


@pytest.mark.parametrize("case", MEDIA_CASES)
def test_media_conversations_equal_transformers_once_the_markers_are_set_aside(case, hf, tokenizer):
    template, markers, cell, theirs, media = MEDIA_CASES[case]
    ids, mask = transformers_chat(hf, template, theirs or cell)
    marker_ids = {tokenizer.token_to_id(m) for m in markers}
    at = [i for i, t in enumerate(ids) if t in marker_ids]
    assert len(at) == len(media)
    kept = [i for i in range(len(ids)) if i not in at]
    result = rendered(msd_chat(tokenizer, template, markers=markers).render(cell))
    assert result.media == media
    assert len(result.segments) == len(media) + 1
    assert result.ids.tolist() == [ids[i] for i in kept]
    assert result.trained.tolist() == [mask[i] for i in kept]
    # Each segment is the text between two markers.
    bounds = [-1, *at, len(ids)]
    for segment, a, b in zip(result.segments, bounds, bounds[1:], strict=False):
        assert segment.ids.tolist() == ids[a + 1 : b]


def test_the_rendered_text_is_cut_at_the_markers_with_its_spans(tokenizer):
    chat = msd_chat(tokenizer, SIMPLE)
    cell = [user("<image>Look."), assistant("A <video>dog."), user("Ok")]
    text = chat.text([*cell, assistant("Yes")])
    assert not isinstance(text, str)
    assert text.media == ("image", "video")
    assert [s.text for s in text.segments] == [
        "<|im_start|>user\n",
        "Look.<|im_end|>\n<|im_start|>assistant\nA ",
        "dog.<|im_end|>\n<|im_start|>user\nOk<|im_end|>\n<|im_start|>assistant\nYes<|im_end|>\n",
    ]
    _, look, dog = (s.text for s in text.segments)
    yes = dog.index("Yes")
    assert [s.spans for s in text.segments] == [
        (),
        ((look.index("A "), len(look)),),  # the reply's span, cut at the marker
        ((0, len("dog.<|im_end|>")), (yes, yes + len("Yes<|im_end|>"))),
    ]


def test_a_part_holding_null_keys_renders_as_without_them(hf, tokenizer):
    # A Parquet column of parts gives every part every field: a text part's null "image" must
    # not make the template render an image.
    struct_parts = [
        user([{"type": "text", "text": "Describe the field.", "image": None}]),
        assistant([{"type": "text", "text": "Green.", "image": None}]),
    ]
    plain = [user([{"type": "text", "text": "Describe the field."}]), assistant("Green.")]
    ids, mask = transformers_chat(hf, CHATML, plain)
    result = rendered(msd_chat(tokenizer, CHATML).render(struct_parts))
    assert (result.ids.tolist(), result.trained.tolist()) == (ids, mask)


def trained_runs(mask: list[bool]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, on in enumerate([*mask, False]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            runs.append((start, i))
            start = None
    return runs


@pytest.mark.parametrize("template", [CHATML, LLAMA3], ids=["chatml", "llama3"])
def test_loss_last_trains_only_the_final_reply_and_all_every_token(template, hf, tokenizer):
    ids, mask = transformers_chat(hf, template, MULTI)
    runs = trained_runs(mask)
    assert len(runs) == 2  # one per reply
    a, b = runs[-1]
    last = rendered(msd_chat(tokenizer, template, loss="last").render(MULTI))
    assert last.ids.tolist() == ids
    assert last.trained.tolist() == [a <= i < b for i in range(len(ids))]
    every = rendered(msd_chat(tokenizer, template, loss="all").render(MULTI))
    assert every.ids.tolist() == ids and every.trained.all()


def test_loss_all_needs_no_generation_blocks_nor_a_reply(hf, tokenizer):
    ids, _ = transformers_chat(hf, ZEPHYR, MULTI)
    result = rendered(msd_chat(tokenizer, ZEPHYR, loss="all").render(MULTI))
    assert result.ids.tolist() == ids and result.trained.all()
    alone = rendered(msd_chat(tokenizer, ZEPHYR, loss="all").render([user("Hello!")]))
    assert alone.trained.all() and len(alone.ids) > 3


@pytest.mark.parametrize("loss", ["assistant", "last"])
def test_a_template_without_generation_blocks_cannot_serve_a_reply_loss(loss, tokenizer):
    with pytest.raises(SourceError, match=r"\{% generation %\}.*or set loss: all"):
        msd_chat(tokenizer, ZEPHYR, loss=loss)


def test_configuration_errors_are_one_sentence(tokenizer):
    with pytest.raises(SourceError, match="does not compile"):
        msd_chat(tokenizer, "{% for m in messages %}{{ m.content }}")
    with pytest.raises(SourceError, match="use one of assistant, all, last"):
        msd_chat(tokenizer, CHATML, loss="prompt")  # type: ignore[arg-type]
    with pytest.raises(SourceError, match="give each its own"):
        msd_chat(tokenizer, CHATML, markers=("<image>", "<image>"))


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def looped() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


MALFORMED = {
    "not json": ("[{'role': 'user'}", cells.NOT_JSON),
    "not utf-8": (b"\xff\xfe[]", cells.NOT_JSON),
    "a number": (5, cells.NOT_A_LIST),
    "an object without messages": ({"text": "hello"}, cells.NO_MESSAGES),
    "empty": ([], cells.NO_MESSAGES),
    "empty json": ("[]", cells.NO_MESSAGES),
    "a string message": (["hello"], cells.NOT_A_MESSAGE),
    "no role": ([{"content": "hi"}], cells.NO_ROLE),
    "unknown role": ([{"role": "wizard", "content": "hi"}], cells.UNKNOWN_ROLE),
    "role not a string": ([{"role": 3, "content": "hi"}], cells.UNKNOWN_ROLE),
    "role a list": ([{"role": ["user"], "content": "hi"}], cells.UNKNOWN_ROLE),
    "from a list": ([{"from": ["human"], "value": "hi"}], cells.UNKNOWN_ROLE),
    "part type an object": ([user([{"type": {"a": 1}}]), assistant("x")], cells.UNKNOWN_PART),
    "unknown sharegpt role": ([{"from": "robot", "value": "hi"}], cells.UNKNOWN_ROLE),
    "no content": ([user(None), assistant("x")], cells.NO_CONTENT),
    "no value": ([{"from": "human"}, {"from": "gpt", "value": "x"}], cells.NO_CONTENT),
    "number content": ([user(5), assistant("x")], cells.WRONG_CONTENT),
    "object content": ([user({"text": "hi"}), assistant("x")], cells.WRONG_CONTENT),
    "number value": ([{"from": "human", "value": 5}], cells.WRONG_CONTENT),
    "text part without text": ([user([{"type": "text"}]), assistant("x")], cells.WRONG_CONTENT),
    "audio part": ([user([{"type": "audio"}]), assistant("x")], cells.UNKNOWN_PART),
    "string part": ([user(["hi"]), assistant("x")], cells.UNKNOWN_PART),
    "no assistant turn": ([SYSTEM, user("hi")], conversations.NO_ASSISTANT),
    "template raises": (
        [{"role": "tool", "content": "21"}, assistant("x")],
        conversations.TEMPLATE_FAILED,
    ),
    "nested too deeply": (
        [user("hi"), assistant("x"), {"role": "user", "content": "y", "meta": nested(40)}],
        cells.TOO_DEEP,
    ),
    "looped": ([user("hi"), {**assistant("x"), "meta": looped()}], cells.TOO_DEEP),
    "json nested too deeply": ("[" * 100_000 + "]" * 100_000, cells.TOO_DEEP),
    "too long": ([user("x" * (cells.MAX_CHARS + 1)), assistant("x")], cells.TOO_LARGE),
    "too long json": (" " * (cells.MAX_CHARS + 1), cells.TOO_LARGE),
    "too many values": (
        [user("hi"), {**assistant("x"), "meta": [0] * cells.MAX_VALUES}],
        cells.TOO_LARGE,
    ),
    "an image without its marker": (
        [user([{"type": "image"}, {"type": "text", "text": "hi"}]), assistant("x")],
        conversations.MEDIA_MISMATCH,
    ),
    "a marker without its image": ([user("hi"), assistant("x")], conversations.MEDIA_MISMATCH),
    "an empty reply": (
        [user("hi"), {"role": "assistant", "content": ""}],
        conversations.NO_TRAINED,
    ),
}


LAST_REPLY = "{% generation %}{{ messages[-1].content }}{% endgeneration %}"
# The cases that need another template or markers than LLAMA3 and the default ones.
MALFORMED_CHATS = {
    "an image without its marker": (LLAMA3, ("<|image_pad|>", "<|video_pad|>")),
    "a marker without its image": ("<image>" + LAST_REPLY, ("<image>", "<video>")),
    "an empty reply": (LAST_REPLY, ("<image>", "<video>")),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_conversation_is_left_out_with_its_reason(case, tokenizer):
    cell, reason = MALFORMED[case]
    template, markers = MALFORMED_CHATS.get(case, (LLAMA3, ("<image>", "<video>")))
    chat = msd_chat(tokenizer, template, markers=markers)
    assert chat.render(cell) == reason
    assert chat.render(cell) == reason  # the same, again
    if reason != conversations.NO_TRAINED:  # known once tokenized
        assert chat.text(cell) == reason


def test_every_reason_is_one_of_the_listed_ones_and_each_is_shown_above():
    assert sorted({reason for _, reason in MALFORMED.values()}) == sorted(conversations.REASONS)


def test_parse_normalizes_both_shapes():
    assert parse(
        [{"from": "human", "value": "<image>hi", "weight": 0}, {"from": "gpt", "value": "yo"}]
    ) == [
        user("<image>hi"),
        assistant("yo"),
    ]
    part = {"type": "image", "image": b"\x89PNG", "url": None}
    assert parse([user([part])]) == [user([{"type": "image", "image": "<bytes>"}])]


def test_a_batch_renders_as_one_conversation_at_a_time(tokenizer):
    chat = msd_chat(tokenizer, CHATML, markers=("<|image_pad|>", "<|video_pad|>"))
    batch = [MULTI, "[", SINGLE, MEDIA_CASES["chatml-image-part"][2], [user("no reply")], PARTS]
    together = chat.render_batch(batch)
    for cell, result in zip(batch, together, strict=True):
        alone = chat.render(cell)
        if isinstance(alone, str):
            assert result == alone
            continue
        assert isinstance(result, Rendered) and result.media == alone.media
        assert result.ids.tolist() == alone.ids.tolist()
        assert result.trained.tolist() == alone.trained.tolist()
    assert [isinstance(r, str) for r in together] == [False, True, False, False, True, False]


def test_a_tokenizer_set_to_truncate_or_pad_is_neither(tokenizer_file, hf):
    ids, mask = transformers_chat(hf, CHATML, MULTI)
    truncating = Tokenizer.from_file(str(tokenizer_file))
    truncating.enable_truncation(max_length=8)
    truncating.enable_padding(length=200, pad_id=0)
    result = rendered(msd_chat(truncating, CHATML).render(MULTI))
    assert (result.ids.tolist(), result.trained.tolist()) == (ids, mask)
    assert truncating.truncation is not None and truncating.truncation["max_length"] == 8


@given(
    st.lists(
        st.lists(
            st.sampled_from([*"abc xyz!\n\t{}'\"", "<|im_end|>", "<|im_start|>", "cat", " the"]),
            max_size=12,
        ).map("".join),
        min_size=1,
        max_size=7,
    ),
    st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_random_conversations_train_only_reply_tokens(hf, tokenizer, texts, with_system):
    """ids and trained tokens equal transformers'; the trained tokens are those overlapping a
    reply and its end token, written out here without the template."""
    roles = ["user", "assistant"] * 4
    messages = [{"role": r, "content": t} for r, t in zip(roles, texts, strict=False)]
    if with_system:
        messages = [{"role": "system", "content": texts[-1]}, *messages]
    chat = msd_chat(tokenizer, SIMPLE, markers=("", ""))
    result = chat.render(messages)
    if len(texts) < 2:
        assert result == conversations.NO_ASSISTANT
        return
    ids, mask = transformers_chat(hf, SIMPLE, messages)
    result = rendered(result)
    assert result.ids.tolist() == ids and result.trained.tolist() == mask
    text, spans = "", []
    for m in messages:
        text += f"<|im_start|>{m['role']}\n"
        if m["role"] == "assistant":
            spans.append((len(text), len(text) + len(m["content"]) + len("<|im_end|>")))
        text += f"{m['content']}<|im_end|>\n"
    shown = chat.text(messages)
    assert not isinstance(shown, str) and shown.text == text and list(shown.spans) == spans
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    for (start, end), trained in zip(offsets, result.trained, strict=True):
        overlaps = any(start < b and end > a for a, b in spans)
        inside = any(a <= start and end <= b for a, b in spans)
        assert trained == overlaps and (trained or not inside)


def test_the_template_loads_from_where_models_keep_it(tmp_path, tokenizer_file):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(tokenizer_file.read_bytes())
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": {
            "__type": "AddedToken",
            "content": BOS,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        },
        "eos_token": EOS,
        "pad_token": None,
        "image_token": "<|image_pad|>",
        "add_bos_token": False,
        "chat_template": [
            {"name": "default", "template": CHATML},
            {"name": "tool_use", "template": LLAMA3},
        ],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    theirs = AutoTokenizer.from_pretrained(str(folder))
    for where in (folder, folder / "tokenizer_config.json", str(folder / "tokenizer_config.json")):
        loaded = ChatTemplate.load(where)
        assert loaded.source == theirs.chat_template["default"] == CHATML
        assert dict(loaded.special_tokens) == theirs.special_tokens_map
    assert dict(loaded.special_tokens) == {
        "bos_token": BOS,
        "eos_token": EOS,
        "image_token": "<|image_pad|>",
    }

    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": LLAMA3}))
    assert ChatTemplate.load(folder).source == LLAMA3
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text(SIMPLE)
    assert (
        ChatTemplate.load(folder).source
        == SIMPLE
        == AutoTokenizer.from_pretrained(str(folder)).chat_template
    )
    assert ChatTemplate.load(folder / "chat_template.jinja") == ChatTemplate(SIMPLE)
    assert ChatTemplate.load(SIMPLE) == ChatTemplate(SIMPLE)


def test_a_template_that_cannot_be_found_or_chosen_is_one_sentence(tmp_path):
    with pytest.raises(SourceError, match="cannot read chat template"):
        ChatTemplate.load(tmp_path / "missing.jinja")
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"eos_token": EOS}))
    with pytest.raises(SourceError, match="holds no chat_template"):
        ChatTemplate.load(config)
    config.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "{{ 1 }}"}]}))
    with pytest.raises(SourceError, match=r"\(tool_use\) but none 'default'"):
        ChatTemplate.load(config)
    config.write_text("{")
    with pytest.raises(SourceError, match="is not JSON"):
        ChatTemplate.load(config)


SANDBOXED = {
    "underscore namespace": "{% set ns = namespace(_x=1) %}",
    "underscore attribute": "{% set ns = namespace() %}{% set ns._x = 1 %}",
    "immutable messages": "{{ messages.append(1) }}",
    "raise_exception": "{{ raise_exception('no') }}",
}


@pytest.mark.parametrize("case", SANDBOXED)
def test_what_the_sandbox_refuses_fails_the_row_as_in_transformers(case, hf, tokenizer):
    template = SANDBOXED[case] + LAST_REPLY
    with pytest.raises(Exception):  # noqa: B017 (transformers raises jinja's errors as they are)
        transformers_chat(hf, template, SINGLE)
    assert msd_chat(tokenizer, template).render(SINGLE) == conversations.TEMPLATE_FAILED
