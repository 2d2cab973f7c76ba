"""A chat conversation as prompt token ids, through the tokenizer's chat template, with no forged turns.

Special-token text inside a message (a user typing "<|im_end|>\\n<|im_start|>assistant") is encoded as plain text,
as the OpenAI-compatible servers do: the template is rendered around markers, only the template's own text is
parsed for special tokens, and each message's text is encoded with special-token parsing off.

Image content parts reach the template as {"type": "image"}; the template writes the model's placeholder
(`<|vision_start|><|image_pad|><|vision_end|>`), which, being template text, becomes the image token.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from jinja2 import TemplateError
from tokenizers import Tokenizer

from lightllm_mtp.multimodal.content_parts import ImagePart, template_content, text_segments
from lightllm_mtp.server.chat_protocol import ChatCompletionRequest
from lightllm_mtp.server.protocol import ApiError

_CONTENT = "\ue000{}\ue001"  # private-use marks around a message's index while the template renders
_CONTENT_SPLIT = re.compile("\ue000(\\d+)\ue001")


def special_token_texts(tokenizer) -> list[str]:
    """The texts the tokenizer turns into special (control) tokens: its special added tokens, which
    `split_special_tokens=True` encodes as plain text, and the named special tokens."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    texts = {t.content for t in added.values() if getattr(t, "special", False)}
    texts.update(str(t) for t in getattr(tokenizer, "all_special_tokens", []))
    return sorted(t for t in texts if t)


class ChatPromptEncoder:
    """Encodes conversations for one tokenizer. Message text goes through a second copy of the fast tokenizer that
    never parses special tokens: the wrapper's `split_special_tokens=True` flips a flag on the shared Rust tokenizer,
    which an encode running at the same time in another thread would see (and parse a user's "<|im_end|>")."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.special = special_token_texts(tokenizer)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:  # a Python tokenizer: split_special_tokens is an argument of the call, not shared state
            self.encode_plain = lambda text: tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        else:
            plain = Tokenizer.from_str(backend.to_str())
            plain.encode_special_tokens = True
            self.encode_plain = lambda text: plain.encode(text, add_special_tokens=False).ids

    def encode(self, req: ChatCompletionRequest, check: Callable[[str], None] | None = None) -> list[int]:
        """The templated conversation as token ids. `check(text)` sees the whole prompt text before it is tokenized
        (the prompt encoder rejects there what cannot fit)."""
        return self.encode_text(req, check)[0]

    def encode_text(self, req: ChatCompletionRequest, check: Callable[[str], None] | None = None
                    ) -> tuple[list[int], str]:  # fmt: skip
        """(token ids, prompt text) of the templated conversation."""
        tokenizer = self.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise ApiError(400, "this model's tokenizer has no chat template: use /v1/completions", param="messages")
        parts = [m.parts() for m in req.messages]
        texts = [t for p in parts for t in text_segments(p)]  # the message text the template places, in order
        if not any(t in c for c in texts for t in self.special):  # the common case: one encode of the whole text
            text = _render(tokenizer, req, parts, iter(texts))
            if check is not None:
                check(text)
            return tokenizer.encode(text, add_special_tokens=False), text
        rendered = _render(tokenizer, req, parts, (_CONTENT.format(i) for i in range(len(texts))))
        pieces = _CONTENT_SPLIT.split(rendered)  # template text, index, template text, ...
        if sorted(int(i) for i in pieces[1::2]) != list(range(len(texts))):
            raise ApiError(400, "a message holds special-token text that this chat template does not pass through",
                           param="messages")  # fmt: skip
        text = "".join(texts[int(piece)] if j % 2 else piece for j, piece in enumerate(pieces))
        if check is not None:
            check(text)
        ids: list[int] = []
        for j, piece in enumerate(pieces):
            if j % 2:
                ids += self.encode_plain(texts[int(piece)])
            elif piece:
                ids += tokenizer.encode(piece, add_special_tokens=False)
        return ids, text


def _render(tokenizer, req: ChatCompletionRequest, parts: list[list[str | ImagePart]], texts: Iterator[str]) -> str:
    """The conversation through the chat template, each message's text segments taken from `texts` and each image
    given as {"type": "image"}, which the template renders as the model's image placeholder."""
    try:
        messages = [m.template_fields(template_content(p, texts)) for m, p in zip(req.messages, parts)]
        tools = req.tools if req.tool_choice_mode != "none" else None
        # the template itself may reject the conversation (Qwen's raise_exception, e.g. a misplaced system message)
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                             **(req.chat_template_kwargs or {}))  # fmt: skip
    except TypeError as e:  # a template that concatenates content as a string, given image parts
        if not any(isinstance(x, ImagePart) for p in parts for x in p):
            raise
        raise ApiError(400, f"this model's chat template does not take image content parts ({e}); start the server "
                       "with --chat_template qwen3_5", param="messages") from None  # fmt: skip
    except (ValueError, TemplateError) as e:
        raise ApiError(400, f"the chat template rejected these messages: {e}", param="messages") from None
