"""Reading what a client sends, without letting one request stall the others: the body read up to a size cap, and
prompt text checked against a sound lower bound of its token count before it is tokenized, off the event loop, and a
chat's images counted against the limit before any is decoded, then decoded and preprocessed there too.

The bound: a token covers at most `max_token_bytes` UTF-8 bytes of (normalized) text, so a text of n bytes has at
least ceil(n / max_token_bytes) tokens, and one with at least max_model_len tokens cannot fit (the prompt needs room
for one generated token). This holds for byte-level BPE (Qwen, Llama 3, GPT-2): its pre-tokenizer keeps every byte
and its vocabulary spells one byte per character, so the longest entry, in characters, is the most bytes a token
covers (special tokens: their text's bytes). Text is first measured as sent; only when that says "cannot fit" is it
measured again after the tokenizer's normalizer (which may shorten it, e.g. NFC composes), so the bound never
rejects text that would fit. That second measure normalizes pieces of NORMALIZE_PIECE_CHARS characters (the
normalizer holds the GIL: one call on 8 MB stalled the event loop for a second) and stops as soon as the pieces
prove the text too long; for the Unicode normal forms and lowercasing, whose output over a text is that over its
pieces except for a few code points composed across each cut (CUT_SLACK_BYTES), the sum less that slack per cut
is a sound lower bound. Other normalizers are measured whole. Tokenizers where no such bound holds (a pre-tokenizer
that drops whitespace, an added token that swallows the whitespace beside it, no fast tokenizer) get no early check:
their text is tokenized whole, in the thread pool, and the body cap bounds the cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from fastapi import Request

from lightllm_mtp.multimodal.image_input import ImageInput
from lightllm_mtp.multimodal.image_intake import ImageIntake
from lightllm_mtp.multimodal.image_loading import ImageInputError
from lightllm_mtp.server.chat_prompt import ChatPromptEncoder
from lightllm_mtp.server.chat_protocol import ChatCompletionRequest
from lightllm_mtp.server.protocol import ApiError, parse_body

TOKENIZE_THREADS = 2
INLINE_PARSE_BYTES = 64 * 1024  # larger bodies are parsed in the thread pool too (8 MiB of JSON: ~0.5 s of CPU)
_KEEPS_EVERY_BYTE = {"ByteLevel", "Digits", "Split", "Punctuation", "Sequence"}  # unless `behavior` is "removed"
NORMALIZE_PIECE_CHARS = 1 << 15  # ~2 ms of NFC per call: the event loop gets the GIL between pieces
# normalizers that map a text piece by piece, but for compositions across a cut: a starter and the few combining
# marks (or Hangul jamo) it absorbs, each at most 4 UTF-8 bytes, so well under CUT_SLACK_BYTES saved per cut
_PIECEWISE_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase"}
CUT_SLACK_BYTES = 64


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int  # larger bodies get 413
    timeout_s: float  # a body not received whole within this gets 408 (slow-body clients)


async def read_body(request: Request, limits: BodyLimits) -> bytes:
    """The body, or 413 as soon as it is known to exceed the size limit (declared length, or bytes received), or 408
    when it takes longer than the time limit. A client that leaves meanwhile raises starlette's ClientDisconnect
    (answered quietly by the app, http_app.py)."""
    limit = limits.max_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body has {declared} bytes; this server takes at most {limit}",
                       code="request_too_large")  # fmt: skip

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"the request body exceeds {limit} bytes", code="request_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), limits.timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body was not received within {limits.timeout_s:g} s",
                       code="request_timeout") from None  # fmt: skip


def _backend_spec(tokenizer) -> dict | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return json.loads(backend.to_str()) if backend is not None else None


def normalizes_piecewise(tokenizer) -> bool:
    """Whether the tokenizer's normalizer (if any) is one of, or a sequence of, _PIECEWISE_NORMALIZERS."""
    spec = _backend_spec(tokenizer)
    parts = [(spec or {}).get("normalizer") or {"type": "Sequence"}]
    while parts:
        part = parts.pop()
        if part.get("type") == "Sequence":
            parts += part.get("normalizers") or []
        elif part.get("type") not in _PIECEWISE_NORMALIZERS:
            return False
    return True


def max_token_bytes(tokenizer) -> int | None:
    """The most UTF-8 bytes of text one token covers, or None where the tokenizer admits no such bound."""
    spec = _backend_spec(tokenizer)
    if spec is None:
        return None
    added = spec.get("added_tokens") or []
    if any(t.get("lstrip") or t.get("rstrip") for t in added):  # such a token also covers the whitespace beside it
        return None
    parts, byte_level = [spec.get("pre_tokenizer") or {}], False
    while parts:
        part = parts.pop()
        kind = part.get("type")
        if kind not in _KEEPS_EVERY_BYTE or str(part.get("behavior", "")).lower() == "removed":
            return None
        byte_level |= kind == "ByteLevel"
        parts += part.get("pretokenizers") or []
    vocab = (spec.get("model") or {}).get("vocab")
    if not byte_level or spec["model"].get("type") != "BPE" or not isinstance(vocab, dict) or not vocab:
        return None
    return max(max(map(len, vocab)), max((len(t["content"].encode("utf-8")) for t in added), default=1))


class PromptEncoder:
    """Parses large bodies and tokenizes prompt text and chat conversations in a small thread pool (neither blocks
    the event loop), tokenizing after the lower-bound check above; a conversation's images are decoded and
    preprocessed there too (`images`, default: none taken)."""

    def __init__(self, tokenizer, max_model_len: int, images: ImageIntake | None = None):
        self.tokenizer = tokenizer
        self.images = images if images is not None else ImageIntake.text_only()
        self.max_model_len = max_model_len
        self.max_token_bytes = max_token_bytes(tokenizer)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.normalizer = backend.normalizer if backend is not None else None
        self.piecewise = self.normalizer is not None and normalizes_piecewise(tokenizer)
        self.chat = ChatPromptEncoder(tokenizer)
        self.executor = ThreadPoolExecutor(max_workers=TOKENIZE_THREADS, thread_name_prefix="tokenize")

    def min_tokens(self, text: str, normalized: bool = False) -> int:
        """A lower bound of the token count of `text` (0 where the tokenizer admits none). normalized: measure the
        text after the tokenizer's normalizer (slower; never larger), only as far as max_model_len tokens."""
        if self.max_token_bytes is None:
            return 0
        if not normalized or self.normalizer is None:
            return -(-_utf8_bytes(text) // self.max_token_bytes)
        return -(-self._normalized_bytes(text, self.max_model_len * self.max_token_bytes) // self.max_token_bytes)

    def _normalized_bytes(self, text: str, enough: int) -> int:
        """A lower bound of the UTF-8 bytes of the normalized text, from its pieces until it reaches `enough`."""
        if not self.piecewise:
            return _utf8_bytes(self.normalizer.normalize_str(text))
        total = bound = 0
        for cuts, start in enumerate(range(0, len(text), NORMALIZE_PIECE_CHARS)):
            total += _utf8_bytes(self.normalizer.normalize_str(text[start : start + NORMALIZE_PIECE_CHARS]))
            bound = total - cuts * CUT_SLACK_BYTES
            if bound >= enough:
                break
        return max(0, bound)

    def check_fits(self, text: str, param: str) -> None:
        if self.min_tokens(text) < self.max_model_len:
            return
        at_least = self.min_tokens(text, normalized=True)
        if at_least >= self.max_model_len:
            raise ApiError(400, f"the {param} has at least {at_least} tokens; this model's maximum context length is "
                           f"{self.max_model_len} (prompt + at least one generated token)", param=param,
                           code="context_length_exceeded")  # fmt: skip

    async def parse(self, model, raw: bytes):
        """`parse_body(model, raw)`, off the event loop for large bodies."""
        if len(raw) <= INLINE_PARSE_BYTES:
            return parse_body(model, raw)
        return await self.run(parse_body, model, raw)

    async def run(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) in the tokenizer thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    async def encode(self, text: str, param: str = "prompt") -> list[int]:
        return await self.run(self._encode, text, param)

    async def encode_chat(self, req: ChatCompletionRequest, param: str = "messages") -> list[int]:
        """The conversation's token ids through the chat template, images expanded to their tokens."""
        return (await self.encode_chat_text(req, param)).ids

    async def encode_chat_text(self, req: ChatCompletionRequest, param: str = "messages") -> ChatPrompt:
        """The conversation through the chat template, the whole prompt text checked before it is tokenized; its
        images (checked against the limits before any is decoded) loaded and preprocessed in the thread pool."""
        parts = req.image_parts()
        with _image_errors(param, "unsupported_input"):
            self.images.check_count(len(parts))
        ids, text = await self.run(self.chat.encode_text, req, functools.partial(self.check_fits, param=param))
        if not parts:
            return ChatPrompt(ids, text)
        images = await self.run(self._load_images, parts, param)
        with _image_errors(param, "invalid_image"):
            ids = self.images.expand(ids, images)
        return ChatPrompt(ids, text, tuple(images))

    def _load_images(self, parts, param: str) -> list[ImageInput]:
        with _image_errors(param, "invalid_image"):
            return self.images.load(parts)

    def _encode(self, text: str, param: str) -> list[int]:
        self.check_fits(text, param)
        return self.tokenizer.encode(text, add_special_tokens=False)


def _utf8_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class ChatPrompt:
    ids: list[int]  # each image's placeholder expanded to its tokens
    text: str  # the templated conversation (one placeholder per image)
    images: tuple[ImageInput, ...] = ()


@contextlib.contextmanager
def _image_errors(param: str, code: str):
    try:
        yield
    except ImageInputError as e:
        raise ApiError(400, str(e), param=param, code=code) from None
