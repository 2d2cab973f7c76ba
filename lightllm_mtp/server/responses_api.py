"""OpenAI Responses API: POST /v1/responses (whole, or streamed with the Responses event types; input_image parts
are chat's image_url parts).

The request (responses_protocol.py) becomes a chat conversation, encoded by the chat template as
/v1/chat/completions does, with the same tools, tool_choice grammar and parsers (chat_output.py's plan); the answer
becomes output items (responses_output.py): a reasoning item, message items, function_call items.
`max_output_tokens`, `temperature`, `top_p` map onto the same sampling. What each other field does (or its 400):
server/request_fields.py.
"""

from __future__ import annotations

import itertools
import time
import uuid
from typing import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from lightllm_mtp.server.chat_output import ChatOptions, plan_chat
from lightllm_mtp.server.choices import submit_choices
from lightllm_mtp.server.engine_client import Delta, EngineClient, RequestStream
from lightllm_mtp.server.openai_api import check_model, completion_budget
from lightllm_mtp.server.request_input import BodyLimits, PromptEncoder, read_body
from lightllm_mtp.server.responses_output import ResponseOutput, reasoning_tokens
from lightllm_mtp.server.responses_protocol import ResponsesRequest
from lightllm_mtp.server.streaming import ClientDisconnected, collect, mtp_usage, sse_response


def responses_routes(client: EngineClient, encoder: PromptEncoder, model_name: str, auth, body_limits: BodyLimits,
                     options: ChatOptions = ChatOptions()) -> APIRouter:  # fmt: skip
    router = APIRouter(dependencies=[Depends(auth)])

    @router.post("/v1/responses")
    async def responses(request: Request):
        req = await encoder.parse(ResponsesRequest, await read_body(request, body_limits))
        check_model(req, model_name)
        prompt = await encoder.encode_chat_text(req.chat, param="input")
        prompt_ids = prompt.ids
        plan = plan_chat(req.chat, options, prompt.text)
        max_new = completion_budget(client, prompt_ids, req.max_output_tokens, default=client.max_model_len,
                                    field="max_output_tokens")  # fmt: skip
        stream = submit_choices(client, req, prompt_ids, max_new, "responses", structured=plan.structured,
                                images=prompt.images)[0]  # fmt: skip
        response = _response(f"resp_{uuid.uuid4().hex}", model_name, req)
        output = ResponseOutput(plan, req.chat)

        def count_reasoning(ids: list[int]) -> int:
            return reasoning_tokens(client.tokenizer, ids, plan.in_reasoning, plan.tool_call_ends_reasoning)

        if req.stream:
            events = _events(stream, response, output, count_reasoning, req.return_mtp_stats)
            return sse_response(client, stream, events, done_marker=False, named=True)
        try:
            out = await collect(client, stream, request)
        except ClientDisconnected:
            return Response(status_code=499)
        output.push(out.text, final=True)
        output.finish(out.last.finish_reason == "length")
        return JSONResponse(_finished(response, output, out.last, count_reasoning(out.token_ids), req.return_mtp_stats))

    return router


def _response(rid: str, model: str, req: ResponsesRequest) -> dict:
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if req.tools else "none")
    return {
        "id": rid, "object": "response", "created_at": int(time.time()), "status": "in_progress", "model": model,
        "output": [], "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "temperature": req.temperature, "top_p": req.top_p, "parallel_tool_calls": req.parallel_tool_calls,
        "tool_choice": choice, "tools": req.tools or [], "error": None, "incomplete_details": None, "usage": None,
        "metadata": {},
    }  # fmt: skip


def _finished(response: dict, output: ResponseOutput, last: Delta, num_reasoning: int, with_mtp: bool) -> dict:
    incomplete = last.finish_reason == "length"
    usage = {
        "input_tokens": last.num_prompt_tokens,
        "input_tokens_details": {"cached_tokens": last.num_cached_tokens, "cache_write_tokens": 0},
        "output_tokens": last.num_output_tokens, "output_tokens_details": {"reasoning_tokens": num_reasoning},
        "total_tokens": last.num_prompt_tokens + last.num_output_tokens,
    }  # fmt: skip
    if last.num_image_tokens:  # of input_tokens, the images' (an extension, as chat's prompt_tokens_details)
        usage["input_tokens_details"]["image_tokens"] = last.num_image_tokens
    if with_mtp:
        usage["mtp"] = mtp_usage(last.spec)
    return {
        **response,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": list(output.items),
        "usage": usage,
    }


async def _events(stream: RequestStream, response: dict, output: ResponseOutput, count_reasoning,
                  with_mtp: bool) -> AsyncIterator[dict]:  # fmt: skip
    seq = itertools.count()

    def numbered(event: dict) -> dict:
        return {"type": event["type"], "sequence_number": next(seq), **event}

    yield numbered({"type": "response.created", "response": response})
    yield numbered({"type": "response.in_progress", "response": response})
    ids: list[int] = []
    async for d in stream:
        if d.finish_reason == "error":  # the Responses stream's error event, then the response as failed
            error = {"code": "server_error", "message": d.error or "generation failed"}
            yield numbered({"type": "error", **error, "param": None})
            yield numbered({"type": "response.failed", "response": {**response, "status": "failed", "error": error}})
            return
        ids += d.token_ids
        events = output.push(d.text, final=d.finish_reason is not None)
        if d.finish_reason is not None:
            events += output.finish(d.finish_reason == "length")
        for event in events:
            yield numbered(event)
        if d.finish_reason is not None:
            done = _finished(response, output, d, count_reasoning(ids), with_mtp)
            kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
            yield numbered({"type": kind, "response": done})
            return
