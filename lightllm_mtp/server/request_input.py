"""Reading what a client sends, without letting one request stall the others: the body read up to a size cap, and
prompt text checked against a cheap lower bound of its token count before it is tokenized, off the event loop."""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor

from fastapi import Request

from lightllm_mtp.server.protocol import ApiError


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or 413 as soon as it is known to exceed `limit` bytes (declared length, or bytes received)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body has {declared} bytes; this server takes at most {limit}",
                       code="request_too_large")  # fmt: skip
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body exceeds {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


class PromptEncoder:
    """Tokenizes prompt text in a worker thread. Text whose token count is certainly >= max_model_len is rejected
    before: no token of this vocabulary covers more than `max_token_bytes` UTF-8 bytes of text, so a text of n
    bytes has at least ceil(n / max_token_bytes) tokens (a sound bound: it never rejects text that would fit)."""

    def __init__(self, tokenizer, max_model_len: int):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        texts = list(tokenizer.get_vocab()) + [str(t) for t in getattr(tokenizer, "all_special_tokens", [])]
        self.max_token_bytes = max(1, max(len(t.encode("utf-8", "surrogatepass")) for t in texts))
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenize")

    def min_tokens(self, text: str) -> int:
        return -(-len(text.encode("utf-8", "surrogatepass")) // self.max_token_bytes)

    def check_fits(self, text: str, param: str) -> None:
        at_least = self.min_tokens(text)
        if at_least >= self.max_model_len:
            raise ApiError(400, f"the {param} has at least {at_least} tokens; this model's maximum context length is "
                           f"{self.max_model_len} (prompt + at least one generated token)", param=param,
                           code="context_length_exceeded")  # fmt: skip

    async def run(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) in the tokenizer thread pool (tokenizing never blocks the event loop)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    async def encode(self, text: str, param: str = "prompt") -> list[int]:
        self.check_fits(text, param)
        return await self.run(self.tokenizer.encode, text, add_special_tokens=False)
