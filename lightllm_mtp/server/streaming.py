"""Turning a RequestStream into an HTTP answer: collected (non-streaming, with client-disconnect detection) or
as server-sent events. Either way a request whose client goes away is aborted at once, freeing its slots."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from lightllm_mtp.server.engine_client import Delta, EngineClient, RequestStream
from lightllm_mtp.server.protocol import ApiError
from lightllm_mtp.spec_decode.stats import SpecStats


class ClientDisconnected(Exception):
    pass


@dataclass(frozen=True)
class Collected:
    text: str
    token_ids: list[int]
    last: Delta  # the final delta: finish reason, token counts, acceptance
    logprobs: list | None = None  # params.logprobs: one (logprob, top pairs) per token of token_ids


async def collect(client: EngineClient, stream: RequestStream, request: Request) -> Collected:
    """Waits for the whole output; aborts the request if the client disconnects first."""
    watcher = asyncio.ensure_future(_disconnected(request))
    texts: list[str] = []
    ids: list[int] = []
    logprobs: list | None = None
    try:
        while True:
            get = asyncio.ensure_future(stream.get())
            await asyncio.wait({get, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                client.abort(stream)
                raise ClientDisconnected()
            delta = get.result()
            texts.append(delta.text)
            ids += delta.token_ids
            if delta.logprobs is not None:
                logprobs = (logprobs or []) + delta.logprobs
            if delta.finish_reason is not None:
                if delta.finish_reason == "error":
                    raise ApiError(500, delta.error or "generation failed", type="server_error")
                return Collected("".join(texts), ids, delta, logprobs)
    finally:
        watcher.cancel()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def sse_response(client: EngineClient, stream: RequestStream | list[RequestStream], events: AsyncIterator[dict], done_marker: bool = True,
                 named: bool = False):  # fmt: skip
    """`data: {json}` per event (then `data: [DONE]`, OpenAI style); a client that leaves aborts the request.
    named: each event also gets an `event: <its type>` line (the Responses API's stream)."""

    async def body():
        try:
            async for event in events:
                name = f"event: {event['type']}\n" if named else ""
                yield f"{name}data: {json.dumps(event, ensure_ascii=False)}\n\n"
            if done_marker:
                yield "data: [DONE]\n\n"
        finally:
            for s in stream if isinstance(stream, list) else [stream]:
                client.abort(s)  # no-op once the request ended

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def error_event(delta: Delta) -> dict:
    return ApiError(500, delta.error or "generation failed", type="server_error").body()


def mtp_usage(spec: SpecStats | None) -> dict | None:
    if spec is None:
        return None
    return {
        "verify_steps": spec.verify_steps,
        "accepted_drafts": spec.accepted_drafts,
        "mean_accepted_tokens_per_step": spec.tokens_per_step,
        "acceptance_per_position": spec.acceptance_per_position,
        "proposed_per_position": list(spec.proposed_at),
        "accepted_per_position": list(spec.accepted_at),
    }


def usage(last: Delta | list[Delta], with_mtp: bool) -> dict:
    """The usage block of one choice's last delta, or of n choices' (the prompt counted once)."""
    lasts = last if isinstance(last, list) else [last]
    completion = sum(d.num_output_tokens for d in lasts)
    prompt = lasts[0].num_prompt_tokens
    u = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": lasts[0].num_cached_tokens},
    }
    if lasts[0].num_image_tokens:  # of prompt_tokens, the images' (an extension: OpenAI's schema has no field)
        u["prompt_tokens_details"]["image_tokens"] = lasts[0].num_image_tokens
    if with_mtp:
        specs = [d.spec for d in lasts if d.spec is not None]
        u["mtp"] = mtp_usage(sum(specs[1:], specs[0]) if specs else None)
    return u
