"""OpenAI endpoints: /v1/completions, /v1/chat/completions (chat template from the tokenizer), /v1/models."""

from __future__ import annotations

import re
import time
import uuid
from typing import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from jinja2 import TemplateError

from lightllm_mtp.server.engine_client import EngineClient, RequestStream
from lightllm_mtp.server.protocol import ApiError, ChatCompletionRequest, CompletionRequest, SamplingRequest, parse_body
from lightllm_mtp.server.request_input import PromptEncoder, read_body
from lightllm_mtp.server.streaming import ClientDisconnected, collect, error_event, sse_response, usage


def openai_routes(client: EngineClient, model_name: str, auth, max_body_bytes: int) -> APIRouter:
    router = APIRouter(dependencies=[Depends(auth)])
    encoder = PromptEncoder(client.tokenizer, client.max_model_len)

    @router.get("/v1/models")
    async def models():
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "lightllm_mtp",
                "max_model_len": client.max_model_len}  # fmt: skip
        return {"object": "list", "data": [card]}

    @router.post("/v1/completions")
    async def completions(request: Request):
        req = parse_body(CompletionRequest, await read_body(request, max_body_bytes))
        check_model(req, model_name)
        prompt_ids = req.prompt if isinstance(req.prompt, list) else await encoder.encode(req.prompt)
        max_new = completion_budget(client, prompt_ids, req.max_tokens, default=16)
        stream = submit(client, req, prompt_ids, max_new, "completions")
        meta = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": model_name}  # fmt: skip
        if req.stream:
            return sse_response(client, stream, _completion_chunks(stream, req, meta))
        try:
            out = await collect(client, stream, request)
        except ClientDisconnected:
            return Response(status_code=499)
        choice = {"index": 0, "text": out.text, "logprobs": None, "finish_reason": out.last.finish_reason}
        return JSONResponse({**meta, "choices": [choice], "usage": usage(out.last, req.return_mtp_stats)})

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = parse_body(ChatCompletionRequest, await read_body(request, max_body_bytes))
        check_model(req, model_name)
        encoder.check_fits("".join(m.text() if isinstance(m.content, str) else "" for m in req.messages), "messages")
        prompt_ids = await encoder.run(chat_prompt_ids, client.tokenizer, req)
        # OpenAI's default for chat: as much as the context allows
        max_new = completion_budget(client, prompt_ids, req.max_new_tokens, default=client.max_model_len)
        stream = submit(client, req, prompt_ids, max_new, "chat_completions")
        meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": model_name}  # fmt: skip
        if req.stream:
            return sse_response(client, stream, _chat_chunks(stream, req, {**meta, "object": "chat.completion.chunk"}))
        try:
            out = await collect(client, stream, request)
        except ClientDisconnected:
            return Response(status_code=499)
        message = {"role": "assistant", "content": out.text}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": out.last.finish_reason}
        return JSONResponse({**meta, "choices": [choice], "usage": usage(out.last, req.return_mtp_stats)})

    return router


def check_model(req: SamplingRequest, model_name: str) -> None:
    if req.model is not None and req.model != model_name:
        raise ApiError(404, f"The model `{req.model}` does not exist; this server serves `{model_name}`",
                       param="model", code="model_not_found")  # fmt: skip


def completion_budget(client: EngineClient, prompt_ids: list[int], asked: int | None, default: int) -> int:
    """An explicit max_tokens that does not fit beside the prompt is an error (as OpenAI-compatible servers answer);
    the default is cut to what fits."""
    room = client.max_model_len - len(prompt_ids)
    if asked is None:
        return max(1, min(default, room))
    if asked > room:
        raise ApiError(400, f"this model's maximum context length is {client.max_model_len} tokens; the request has "
                       f"{len(prompt_ids)} prompt tokens and asks for {asked} completion tokens "
                       f"({len(prompt_ids) + asked} in all): lower max_tokens or the prompt",
                       param="max_tokens", code="context_length_exceeded")  # fmt: skip
    return asked


_CONTENT = "\ue000{}\ue001"  # private-use marks around a message's index while the template renders
_CONTENT_SPLIT = re.compile("\ue000(\\d+)\ue001")


def chat_prompt_ids(tokenizer, req: ChatCompletionRequest) -> list[int]:
    """The templated conversation as token ids. Special-token text inside a message (a user typing "<|im_end|>") is
    encoded as plain text, so that no message can forge a turn: the template is rendered around markers and only its
    own text is parsed for special tokens."""
    if not getattr(tokenizer, "chat_template", None):
        raise ApiError(400, "this model's tokenizer has no chat template: use /v1/completions", param="messages")
    try:
        contents = [m.text() for m in req.messages]
    except ValueError as e:
        raise ApiError(400, str(e), param="messages") from None
    special = [t for t in tokenizer.all_special_tokens if t]
    if not any(t in c for c in contents for t in special):
        text = _render(tokenizer, req, contents)
        return tokenizer.encode(text, add_special_tokens=False)
    rendered = _render(tokenizer, req, [_CONTENT.format(i) for i in range(len(contents))])
    parts = _CONTENT_SPLIT.split(rendered)  # template text, index, template text, ...
    if sorted(int(i) for i in parts[1::2]) != list(range(len(contents))):
        raise ApiError(400, "a message holds special-token text that this chat template does not pass through",
                       param="messages")  # fmt: skip
    ids: list[int] = []
    for j, part in enumerate(parts):
        if j % 2:
            ids += tokenizer.encode(contents[int(part)], add_special_tokens=False, split_special_tokens=True)
        elif part:
            ids += tokenizer.encode(part, add_special_tokens=False)
    return ids


def _render(tokenizer, req: ChatCompletionRequest, contents: list[str]) -> str:
    try:
        messages = [{"role": m.role, "content": c} for m, c in zip(req.messages, contents)]
        # the template itself may reject the conversation (Qwen's raise_exception, e.g. a misplaced system message)
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except (ValueError, TemplateError) as e:
        raise ApiError(400, f"the chat template rejected these messages: {e}", param="messages") from None


def submit(client: EngineClient, req: SamplingRequest, prompt_ids: list[int], max_new: int, endpoint: str):
    try:
        params = req.sampling_params(max_new)
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    return client.submit(prompt_ids, params, req.stop_strings, endpoint)


async def _completion_chunks(stream: RequestStream, req: CompletionRequest, meta: dict) -> AsyncIterator[dict]:
    async for d in stream:
        if d.finish_reason == "error":
            yield error_event(d)
            return
        if d.text or d.token_ids or d.finish_reason:
            choice = {"index": 0, "text": d.text, "logprobs": None, "finish_reason": d.finish_reason}
            yield _with_usage({**meta, "choices": [choice]}, d, req)
        if d.finish_reason and (req.include_usage or req.return_mtp_stats):
            yield {**meta, "choices": [], "usage": usage(d, req.return_mtp_stats)}


async def _chat_chunks(stream: RequestStream, req: ChatCompletionRequest, meta: dict) -> AsyncIterator[dict]:
    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    yield {**meta, "choices": [first]}
    async for d in stream:
        if d.finish_reason == "error":
            yield error_event(d)
            return
        if d.text or d.token_ids or d.finish_reason:
            delta = {"content": d.text} if d.text or not d.finish_reason else {}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": d.finish_reason}
            yield _with_usage({**meta, "choices": [choice]}, d, req)
        if d.finish_reason and (req.include_usage or req.return_mtp_stats):
            yield {**meta, "choices": [], "usage": usage(d, req.return_mtp_stats)}


def _with_usage(chunk: dict, d, req: SamplingRequest) -> dict:
    """stream_options.continuous_usage_stats: every chunk carries the usage so far."""
    if req.continuous_usage:
        chunk["usage"] = usage(d, with_mtp=False)
    return chunk
