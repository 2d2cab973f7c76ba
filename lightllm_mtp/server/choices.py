"""n choices of one OpenAI request (n engine requests, collected together or streamed merged, each chunk with its
choice index) and the logprobs blocks of completions and chat choices."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import AsyncIterator

from fastapi import Request

from lightllm_mtp.multimodal.image_input import ImageInput
from lightllm_mtp.sampling_params import StructuredOutput
from lightllm_mtp.server.engine_client import Delta, EngineClient, RequestStream
from lightllm_mtp.server.protocol import ApiError, SamplingRequest
from lightllm_mtp.server.streaming import Collected, collect


def submit_choices(client: EngineClient, req: SamplingRequest, prompt_ids: list[int], max_new: int, endpoint: str,
                   structured: StructuredOutput | None | str = "request",
                   images: tuple[ImageInput, ...] = ()) -> list[RequestStream]:  # fmt: skip
    """One engine request per choice (every one validated before any is queued). structured: the grammar to
    enforce instead of the request's own (chat: the tool_choice grammar, or one that starts after the reasoning).
    images: the prompt's, in placeholder order (each choice's request carries them)."""
    try:
        params = [req.sampling_params(max_new, choice=i) for i in range(req.n)]
        if structured != "request":
            params = [dataclasses.replace(p, structured=structured) for p in params]
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    streams: list[RequestStream] = []
    try:
        for p in params:
            streams.append(client.submit(prompt_ids, p, req.stop_strings, endpoint, images=images))
    except ApiError:
        for s in streams:
            client.abort(s)
        raise
    return streams


async def collect_choices(client: EngineClient, streams: list[RequestStream], request: Request) -> list[Collected]:
    """Every choice's output; a client that leaves (or one choice's error) aborts them all."""
    tasks = [asyncio.ensure_future(collect(client, s, request)) for s in streams]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        for s in streams:
            client.abort(s)
        raise


async def merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, Delta]]:
    """(choice index, delta) from every stream as they come, until each has ended."""
    if len(streams) == 1:
        async for d in streams[0]:
            yield 0, d
        return
    pending = {asyncio.ensure_future(s.get()): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: pending[t]):
                i = pending.pop(task)
                d = task.result()
                yield i, d
                if d.finish_reason is None:
                    pending[asyncio.ensure_future(streams[i].get())] = i
    finally:
        for task in pending:
            task.cancel()


def _token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def completion_logprobs(tokenizer, token_ids: list[int], logprobs: list | None, offset: int = 0) -> dict | None:
    """The completions choice's `logprobs`: tokens, token_logprobs, top_logprobs, text_offset (from `offset`)."""
    if logprobs is None:
        return None
    tokens = [_token_text(tokenizer, t) for t in token_ids]
    offsets, at = [], offset
    for text in tokens:
        offsets.append(at)
        at += len(text)
    tops = [{_token_text(tokenizer, t): lp for t, lp in top} for _, top in logprobs]
    return {"tokens": tokens, "token_logprobs": [lp for lp, _ in logprobs], "top_logprobs": tops,
            "text_offset": offsets}  # fmt: skip


def chat_logprobs(tokenizer, token_ids: list[int], logprobs: list | None) -> dict | None:
    """The chat choice's `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    if logprobs is None:
        return None

    def entry(t: int, lp: float) -> dict:
        text = _token_text(tokenizer, t)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    content = [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in top]}
               for t, (lp, top) in zip(token_ids, logprobs)]  # fmt: skip
    return {"content": content}
