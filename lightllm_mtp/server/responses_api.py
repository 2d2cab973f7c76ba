"""OpenAI Responses API: POST /v1/responses (text and images in, text out; streaming with the Responses event
types).

The input (a string, or messages with input_text / input_image content) and `instructions` become a chat
conversation, encoded by the tokenizer's chat template as /v1/chat/completions does (an input_image is chat's
image_url part); `max_output_tokens`, `temperature`, `top_p` map onto the same sampling. What each other field does
(or its 400): server/request_fields.py.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, AsyncIterator, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, field_validator, model_validator

from lightllm_mtp.server.engine_client import EngineClient, RequestStream
from lightllm_mtp.server.openai_api import check_model, completion_budget, submit
from lightllm_mtp.server.chat_protocol import ChatCompletionRequest
from lightllm_mtp.server.protocol import FIRST_ERROR, STRICT, SamplingRequest
from lightllm_mtp.server.request_fields import RESPONSES
from lightllm_mtp.server.request_input import BodyLimits, PromptEncoder, read_body
from lightllm_mtp.server.streaming import ClientDisconnected, collect, mtp_usage, sse_response


class InputPart(BaseModel):
    """Text, or an image: {"type": "input_image", "image_url": "data:image/...;base64,...", "detail": "auto"}."""

    model_config = STRICT
    type: Literal["input_text", "output_text", "text", "input_image"]
    text: str | None = None
    image_url: str | None = None
    detail: Literal["auto", "low", "high"] = "auto"
    file_id: str | None = None

    @model_validator(mode="after")
    def _complete(self):
        if self.type == "input_image":
            if self.file_id is not None:
                raise ValueError("input_image file_id is not supported (nothing is stored): send image_url as a "
                                 "data: URI")  # fmt: skip
            if self.image_url is None:
                raise ValueError("an input_image part needs image_url (a data: URI)")
        elif self.text is None:
            raise ValueError(f"a {self.type} part needs text")
        return self

    def as_chat_part(self) -> dict:
        if self.type == "input_image":
            return {"type": "image_url", "image_url": {"url": self.image_url, "detail": self.detail}}
        return {"type": "text", "text": self.text}


class InputMessage(BaseModel):
    model_config = STRICT
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | Annotated[list[InputPart], FIRST_ERROR]

    def chat_content(self) -> str | list[dict]:
        return self.content if isinstance(self.content, str) else [p.as_chat_part() for p in self.content]


class ResponsesRequest(SamplingRequest):
    ENDPOINT = RESPONSES
    input: str | Annotated[list[InputMessage], FIRST_ERROR] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = None
    text: dict | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}

    @field_validator("max_output_tokens")
    @classmethod
    def _max_output_tokens(cls, v):
        return cls._max_tokens(v)

    def as_chat(self) -> ChatCompletionRequest:
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            messages.append({"role": "user", "content": self.input})
        else:
            roles = {"developer": "system"}  # the chat templates know system, user, assistant
            messages += [{"role": roles.get(m.role, m.role), "content": m.chat_content()} for m in self.input]
        return ChatCompletionRequest.model_validate({"messages": messages})


def responses_routes(client: EngineClient, encoder: PromptEncoder, model_name: str, auth, body_limits: BodyLimits):
    router = APIRouter(dependencies=[Depends(auth)])

    @router.post("/v1/responses")
    async def responses(request: Request):
        req = await encoder.parse(ResponsesRequest, await read_body(request, body_limits))
        check_model(req, model_name)
        prompt = await encoder.encode_chat_text(req.as_chat(), param="input")
        max_new = completion_budget(client, prompt.ids, req.max_output_tokens, default=client.max_model_len,
                                    field="max_output_tokens")  # fmt: skip
        stream = submit(client, req, prompt.ids, max_new, "responses", images=prompt.images)
        response = _response(f"resp_{uuid.uuid4().hex}", model_name, req)
        item_id = f"msg_{uuid.uuid4().hex}"
        if req.stream:
            events = _events(stream, response, item_id, req.return_mtp_stats)
            return sse_response(client, stream, events, done_marker=False, named=True)
        try:
            out = await collect(client, stream, request)
        except ClientDisconnected:
            return Response(status_code=499)
        return JSONResponse(_finished(response, item_id, out.text, out.last, req.return_mtp_stats))

    return router


def _response(rid: str, model: str, req: ResponsesRequest) -> dict:
    return {
        "id": rid, "object": "response", "created_at": int(time.time()), "status": "in_progress", "model": model,
        "output": [], "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "temperature": req.temperature, "top_p": req.top_p, "parallel_tool_calls": False, "tool_choice": "none",
        "tools": [], "error": None, "incomplete_details": None, "usage": None, "metadata": {},
    }  # fmt: skip


def _message(item_id: str, text: str, status: str) -> dict:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _finished(response: dict, item_id: str, text: str, last, with_mtp: bool) -> dict:
    incomplete = last.finish_reason == "length"
    usage = {
        "input_tokens": last.num_prompt_tokens, "input_tokens_details": {"cached_tokens": last.num_cached_tokens, "cache_write_tokens": 0},
        "output_tokens": last.num_output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": last.num_prompt_tokens + last.num_output_tokens,
    }  # fmt: skip
    if last.num_image_tokens:
        usage["input_tokens_details"]["image_tokens"] = last.num_image_tokens
    if with_mtp:
        usage["mtp"] = mtp_usage(last.spec)
    return {
        **response,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": [_message(item_id, text, "incomplete" if incomplete else "completed")],
        "usage": usage,
    }


async def _events(stream: RequestStream, response: dict, item_id: str, with_mtp: bool) -> AsyncIterator[dict]:
    seq = iter(range(1 << 30))
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    yield {"type": "response.created", "sequence_number": next(seq), "response": response}
    yield {"type": "response.in_progress", "sequence_number": next(seq), "response": response}
    yield {"type": "response.output_item.added", "sequence_number": next(seq), "output_index": 0,
           "item": _message(item_id, "", "in_progress") | {"content": []}}  # fmt: skip
    yield {"type": "response.content_part.added", "sequence_number": next(seq), **where,
           "part": {"type": "output_text", "text": "", "annotations": []}}  # fmt: skip
    texts = []
    async for d in stream:
        if d.finish_reason == "error":  # the Responses stream's error event, then the response as failed
            error = {"code": "server_error", "message": d.error or "generation failed"}
            yield {"type": "error", "sequence_number": next(seq), **error, "param": None}
            failed = {**response, "status": "failed", "error": error}
            yield {"type": "response.failed", "sequence_number": next(seq), "response": failed}
            return
        if d.text:
            texts.append(d.text)
            yield {"type": "response.output_text.delta", "sequence_number": next(seq), **where, "delta": d.text,
                   "logprobs": []}  # fmt: skip
        if d.finish_reason is not None:
            text = "".join(texts)
            yield {"type": "response.output_text.done", "sequence_number": next(seq), **where, "text": text,
                   "logprobs": []}  # fmt: skip
            yield {"type": "response.content_part.done", "sequence_number": next(seq), **where,
                   "part": {"type": "output_text", "text": text, "annotations": []}}  # fmt: skip
            done = _finished(response, item_id, text, d, with_mtp)
            yield {"type": "response.output_item.done", "sequence_number": next(seq), "output_index": 0,
                   "item": done["output"][0]}  # fmt: skip
            kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
            yield {"type": kind, "sequence_number": next(seq), "response": done}
            return
