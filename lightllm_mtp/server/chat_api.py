"""POST /v1/chat/completions: the conversation through the chat template (tools, chat_template_kwargs), n choices,
reasoning_content and tool_calls (chat_output.py), logprobs, streaming."""

from __future__ import annotations

import time
import uuid
from typing import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from lightllm_mtp.server.chat_output import ChatAssembler, ChatOptions, ChatPlan, chat_message, delta_of, plan_chat
from lightllm_mtp.server.chat_protocol import ChatCompletionRequest
from lightllm_mtp.server.choices import chat_logprobs, collect_choices, merged, submit_choices
from lightllm_mtp.server.engine_client import EngineClient, RequestStream
from lightllm_mtp.server.openai_api import _usage_so_far, _with_usage, check_model, completion_budget
from lightllm_mtp.server.request_input import BodyLimits, PromptEncoder, read_body
from lightllm_mtp.server.streaming import ClientDisconnected, error_event, sse_response, usage


def chat_routes(client: EngineClient, encoder: PromptEncoder, model_name: str, auth, body_limits: BodyLimits,
                options: ChatOptions) -> APIRouter:  # fmt: skip
    router = APIRouter(dependencies=[Depends(auth)])

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await encoder.parse(ChatCompletionRequest, await read_body(request, body_limits))
        check_model(req, model_name)
        prompt = await encoder.encode_chat_text(req)
        prompt_ids = prompt.ids
        plan = plan_chat(req, options, prompt.text)
        # OpenAI's default for chat: as much as the context allows
        max_new = completion_budget(client, prompt_ids, req.max_new_tokens, default=client.max_model_len)
        streams = submit_choices(client, req, prompt_ids, max_new, "chat_completions", structured=plan.structured,
                                 images=prompt.images)  # fmt: skip
        meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": model_name}  # fmt: skip
        if req.stream:
            chunk_meta = {**meta, "object": "chat.completion.chunk"}
            return sse_response(client, streams, _chat_chunks(client, streams, req, plan, chunk_meta, prompt_ids))
        try:
            outs = await collect_choices(client, streams, request)
        except ClientDisconnected:
            return Response(status_code=499)
        choices = []
        for i, out in enumerate(outs):
            message, asm = chat_message(plan, req, out.text)
            choice = {"index": i, "message": message, "finish_reason": asm.finish_reason(out.last.finish_reason),
                      "logprobs": chat_logprobs(client.tokenizer, out.token_ids, out.logprobs)}  # fmt: skip
            if req.return_token_ids:
                choice.update(prompt_token_ids=prompt_ids, token_ids=out.token_ids)
            choices.append(choice)
        return JSONResponse({**meta, "choices": choices, "usage": usage([o.last for o in outs], req.return_mtp_stats)})

    return router


async def _chat_chunks(client: EngineClient, streams: list[RequestStream], req: ChatCompletionRequest,
                       plan: ChatPlan, meta: dict, prompt_ids: list[int]) -> AsyncIterator[dict]:  # fmt: skip
    assemblers = [ChatAssembler(plan, req) for _ in streams]
    for i in range(len(streams)):
        first = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        if req.return_token_ids:
            first.update(prompt_token_ids=prompt_ids, token_ids=[])
        so_far = {"usage": _usage_so_far(len(prompt_ids), 0)} if req.continuous_usage else {}
        yield {**meta, "choices": [first], **so_far}
    lasts = []
    async for i, d in merged(streams):
        if d.finish_reason == "error":
            yield error_event(d)
            return
        delta = delta_of(*assemblers[i].push(d.text, final=d.finish_reason is not None))
        if delta or d.token_ids or d.finish_reason:
            choice = {"index": i, "delta": delta, "finish_reason": assemblers[i].finish_reason(d.finish_reason),
                      "logprobs": chat_logprobs(client.tokenizer, d.token_ids, d.logprobs)}  # fmt: skip
            if req.return_token_ids:
                choice["token_ids"] = d.token_ids
            yield _with_usage({**meta, "choices": [choice]}, d, req)
        if d.finish_reason:
            lasts.append(d)
    if req.include_usage or req.return_mtp_stats:
        yield {**meta, "choices": [], "usage": usage(lasts, req.return_mtp_stats)}
