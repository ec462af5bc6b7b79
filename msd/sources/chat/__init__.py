"""Conversations (supervised fine-tuning data): a cell holding a chat, rendered with the model's
chat template and tokenized with the source's tokenizer, the loss on some of its tokens.

**A conversation** is one cell, in either shape:

- OpenAI / Hugging Face ``messages``: ``[{"role": "user", "content": "Hi"}, ...]``, the content
  a string or a list of parts ``{"type": "text", "text": ...}``, ``{"type": "image", ...}``,
  ``{"type": "video", ...}`` (an image or video part's other keys, e.g. ``image``, ``url``,
  ``path``, are kept). Roles: ``system``, ``developer``, ``user``, ``assistant``, ``tool``,
  ``function``, ``ipython``. An assistant message may hold ``tool_calls`` instead of content;
  other keys (``tool_calls``, ``name``, ``reasoning_content``, ...) reach the template.
- ShareGPT / LLaVA ``conversations``: ``[{"from": "human", "value": "<image>\\nWhat is it?"},
  {"from": "gpt", "value": ...}]`` (``from``: ``human`` or ``user``, ``gpt`` or
  ``assistant``, ``system``, ``tool``), images and videos marked in the text.

The cell may be that list, its JSON text, or an object holding it under ``messages`` or
``conversations`` (a WebDataset ``.json`` member). Keys holding null are dropped, as
transformers drops them (in content parts too: a Parquet column of parts gives every part
every field).

**The chat template** is the model's Jinja template, read from its ``tokenizer_config.json``
(its ``chat_template``; of a list of named templates, ``default``; else a
``chat_template.jinja`` beside it; the special tokens the template sees, ``bos_token``,
``eos_token`` and the like, come from the same file), from a ``.jinja`` file, or given inline.
It renders exactly as transformers 5's ``tokenizer.apply_chat_template(messages,
tokenize=True, return_dict=True, return_assistant_tokens_mask=True)`` does: the same sandbox,
the same variables (``add_generation_prompt`` false), the same ``{% generation %}`` spans. The
text is tokenized with the source's ``tokenizer.json`` (no special tokens added: the template
writes them), so the ids and the trained tokens equal transformers'.

**System prompt** (``system``): when given, a conversation without a system message gets one
holding it, first.

**Loss** (``loss``): which tokens are trained.

- ``assistant`` (the default): the tokens inside the template's ``{% generation %}`` blocks;
  with a template in the published style, each assistant reply and its end-of-turn token.
- ``last``: only those of the last ``{% generation %}`` block (the final reply).
- ``all``: every token.

``assistant`` and ``last`` need a template with ``{% generation %}`` blocks (most published
templates have none: add them around each assistant reply and its end-of-turn token, or use
``loss: all``); a conversation without an assistant message has nothing to train then and is
left out.

**Images and videos** are placed at markers in the rendered text (``vision.marker``, default
``<image>``; ``video.marker``, default ``<video>``). A ShareGPT ``value`` holds them already;
an image or video part renders as whatever the template writes for it, so the marker is that
(``<|image_pad|>`` for Qwen2-VL's template). The text is cut at the markers and each piece
tokenized on its own; the placeholders of each image or video go between the pieces,
untrained. The rendered markers must be the conversation's media, in order.

**Left out**, counted by reason, never an error: a cell that is not a conversation
(``conversation not JSON``, ``conversation not a list of messages``, ``no messages``,
``message not an object``, ``message without a role``, ``unknown role``, ``message without
content``, ``content of the wrong type``, ``unknown content part``), one past the bounds
(``conversation too large``: over 32 Mi characters or 1 Mi values; ``conversation nested too
deeply``: over 32 levels), ``no assistant turn``, ``template failed`` (the template raised,
e.g. its ``raise_exception`` on roles out of order), ``markers do not match the media``, and
``no trained tokens``.
"""

from msd.sources.chat.cells import parse
from msd.sources.chat.conversations import (
    LOSSES,
    REASONS,
    Conversations,
    Loss,
    Rendered,
    RenderedText,
    Segment,
)
from msd.sources.chat.template import ChatTemplate
from msd.sources.chat.tokens import TextSegment

__all__ = [
    "LOSSES",
    "REASONS",
    "ChatTemplate",
    "Conversations",
    "Loss",
    "Rendered",
    "RenderedText",
    "Segment",
    "TextSegment",
    "parse",
]
