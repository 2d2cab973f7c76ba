"""vLLM's /tokenize and /detokenize: text or a chat conversation (through the chat template, as
/v1/chat/completions encodes it) to token ids, and token ids back to text."""

from __future__ import annotations

import json

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel

from lightllm_mtp.server.chat_protocol import ChatCompletionRequest
from lightllm_mtp.server.engine_client import EngineClient
from lightllm_mtp.server.protocol import STRICT, ApiError, TokenIds, parse_body
from lightllm_mtp.server.request_input import BodyLimits, PromptEncoder, read_body


class TokenizeRequest(BaseModel):
    model_config = STRICT
    model: str | None = None
    prompt: str | None = None
    messages: list[dict] | None = None  # a chat conversation (with tools / chat_template_kwargs as in chat)
    tools: list[dict] | None = None
    chat_template_kwargs: dict | None = None
    add_special_tokens: bool = False
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = STRICT
    model: str | None = None
    tokens: TokenIds


def tokenize_routes(client: EngineClient, encoder: PromptEncoder, model_name: str, auth,
                    body_limits: BodyLimits) -> APIRouter:  # fmt: skip
    router = APIRouter(dependencies=[Depends(auth)])
    tokenizer = client.tokenizer

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise ApiError(404, f"The model `{name}` does not exist; this server serves `{model_name}`",
                           param="model", code="model_not_found")  # fmt: skip

    @router.post("/tokenize")
    async def tokenize(request: Request):
        req = parse_body(TokenizeRequest, await read_body(request, body_limits))
        check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise ApiError(400, "give prompt or messages", param="prompt")
        if req.messages is not None:
            chat = {"messages": req.messages, "tools": req.tools, "chat_template_kwargs": req.chat_template_kwargs,
                    "tool_choice": "none" if not req.tools else "auto"}  # fmt: skip
            ids = await encoder.encode_chat(parse_body(ChatCompletionRequest, _json(chat)))
        else:
            ids = await encoder.run(tokenizer.encode, req.prompt, add_special_tokens=req.add_special_tokens)
        out = {"count": len(ids), "max_model_len": client.max_model_len, "tokens": ids}
        if req.return_token_strs:
            out["token_strs"] = tokenizer.convert_ids_to_tokens(ids)
        return out

    @router.post("/detokenize")
    async def detokenize(request: Request):
        req = parse_body(DetokenizeRequest, await read_body(request, body_limits))
        check_model(req.model)
        bad = [t for t in req.tokens if not 0 <= t < client.vocab_size]
        if bad:
            raise ApiError(400, f"token ids out of range [0, {client.vocab_size}): {bad[:8]}", param="tokens")
        return {"prompt": await encoder.run(tokenizer.decode, req.tokens)}

    return router


def _json(value) -> bytes:
    return json.dumps(value).encode()
