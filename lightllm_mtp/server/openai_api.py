"""OpenAI endpoints: /v1/completions, /v1/models (and /v1/models/{id}); /v1/chat/completions is chat_api.py's."""

from __future__ import annotations

import time
import uuid
from typing import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from lightllm_mtp.server.choices import collect_choices, completion_logprobs, merged, submit_choices
from lightllm_mtp.server.engine_client import EngineClient, RequestStream
from lightllm_mtp.server.protocol import ApiError, CompletionRequest, SamplingRequest
from lightllm_mtp.server.request_input import BodyLimits, PromptEncoder, read_body
from lightllm_mtp.server.streaming import ClientDisconnected, error_event, sse_response, usage


def openai_routes(client: EngineClient, encoder: PromptEncoder, model_name: str, auth, body_limits: BodyLimits):
    router = APIRouter(dependencies=[Depends(auth)])

    card = {"id": model_name, "object": "model", "created": 0, "owned_by": "lightllm_mtp",
            "max_model_len": client.max_model_len}  # fmt: skip

    @router.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card]}

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != model_name:
            raise ApiError(404, f"The model `{model_id}` does not exist; this server serves `{model_name}`",
                           param="model", code="model_not_found")  # fmt: skip
        return card

    @router.post("/v1/completions")
    async def completions(request: Request):
        req = await encoder.parse(CompletionRequest, await read_body(request, body_limits))
        check_model(req, model_name)
        prompt_ids = req.prompt if isinstance(req.prompt, list) else await encoder.encode(req.prompt)
        max_new = completion_budget(client, prompt_ids, req.max_tokens, default=16)
        streams = submit_choices(client, req, prompt_ids, max_new, "completions")
        meta = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": model_name}  # fmt: skip
        if req.stream:
            return sse_response(client, streams, _completion_chunks(client, streams, req, meta, prompt_ids))
        try:
            outs = await collect_choices(client, streams, request)
        except ClientDisconnected:
            return Response(status_code=499)
        choices = []
        for i, out in enumerate(outs):
            choice = {"index": i, "text": out.text, "finish_reason": out.last.finish_reason,
                      "logprobs": completion_logprobs(client.tokenizer, out.token_ids, out.logprobs)}  # fmt: skip
            if req.return_token_ids:
                choice.update(prompt_token_ids=prompt_ids, token_ids=out.token_ids)
            choices.append(choice)
        return JSONResponse({**meta, "choices": choices, "usage": usage([o.last for o in outs], req.return_mtp_stats)})

    return router


def check_model(req: SamplingRequest, model_name: str) -> None:
    if req.model is not None and req.model != model_name:
        raise ApiError(404, f"The model `{req.model}` does not exist; this server serves `{model_name}`",
                       param="model", code="model_not_found")  # fmt: skip


def completion_budget(client: EngineClient, prompt_ids: list[int], asked: int | None, default: int,
                      field: str = "max_tokens", param: str | None = None) -> int:  # fmt: skip
    """An explicit max_tokens (the request's `field`) that does not fit beside the prompt is an error, as
    OpenAI-compatible servers answer; the default is cut to what fits."""
    room = client.max_model_len - len(prompt_ids)
    if asked is None:
        return max(1, min(default, room))
    if asked > room:
        raise ApiError(400, f"this model's maximum context length is {client.max_model_len} tokens; the request has "
                       f"{len(prompt_ids)} prompt tokens and asks for {asked} completion tokens "
                       f"({len(prompt_ids) + asked} in all): lower {field} or the prompt",
                       param=param or field, code="context_length_exceeded")  # fmt: skip
    return asked


def submit(client: EngineClient, req: SamplingRequest, prompt_ids: list[int], max_new: int, endpoint: str,
           images: tuple = ()):  # fmt: skip
    try:
        params = req.sampling_params(max_new)
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    return client.submit(prompt_ids, params, req.stop_strings, endpoint, images=images)


async def _completion_chunks(client: EngineClient, streams: list[RequestStream], req: CompletionRequest, meta: dict,
                             prompt_ids: list[int]) -> AsyncIterator[dict]:  # fmt: skip
    first = [True] * len(streams)
    offsets = [0] * len(streams)  # text_offset of each choice's next token
    lasts = []
    async for i, d in merged(streams):
        if d.finish_reason == "error":
            yield error_event(d)
            return
        if d.text or d.token_ids or d.finish_reason:
            logprobs = completion_logprobs(client.tokenizer, d.token_ids, d.logprobs, offsets[i])
            if logprobs is not None and logprobs["tokens"]:
                offsets[i] = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
            choice = {"index": i, "text": d.text, "logprobs": logprobs, "finish_reason": d.finish_reason}
            if req.return_token_ids:
                choice["token_ids"] = d.token_ids
                if first[i]:
                    choice["prompt_token_ids"], first[i] = prompt_ids, False
            yield _with_usage({**meta, "choices": [choice]}, d, req)
        if d.finish_reason:
            lasts.append(d)
    if req.include_usage or req.return_mtp_stats:
        yield {**meta, "choices": [], "usage": usage(lasts, req.return_mtp_stats)}


def _with_usage(chunk: dict, d, req: SamplingRequest) -> dict:
    """stream_options.continuous_usage_stats: every chunk carries the usage so far."""
    if req.continuous_usage:
        chunk["usage"] = _usage_so_far(d.num_prompt_tokens, d.num_output_tokens)
    return chunk


def _usage_so_far(num_prompt_tokens: int, num_output_tokens: int) -> dict:
    total = num_prompt_tokens + num_output_tokens
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_output_tokens, "total_tokens": total}
