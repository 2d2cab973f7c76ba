"""LightLLM-style endpoints: POST /generate and /generate_stream with {"inputs": str, "parameters": {...}}.

/generate answers {"generated_text": [text], "count_output_tokens", "finish_reason", "prompt_tokens", "mtp"}.
/generate_stream sends one event per model step (several tokens with MTP):
{"token": {"id": last id, "ids": [...], "text": ..., "logprob": null, "special": false, "count_output_tokens",
"prompt_tokens"}, "generated_text": null, "finished": bool, "finish_reason": ..., "details": null}.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from lightllm_mtp.server.engine_client import EngineClient, RequestStream
from lightllm_mtp.server.generate_protocol import GenerateRequest
from lightllm_mtp.server.openai_api import completion_budget
from lightllm_mtp.server.protocol import ApiError
from lightllm_mtp.server.request_input import BodyLimits, PromptEncoder, read_body
from lightllm_mtp.server.streaming import ClientDisconnected, collect, error_event, mtp_usage, sse_response


def lightllm_routes(client: EngineClient, encoder: PromptEncoder, auth, body_limits: BodyLimits) -> APIRouter:
    router = APIRouter(dependencies=[Depends(auth)])

    async def submit(request: Request, endpoint: str) -> RequestStream:
        req = await encoder.parse(GenerateRequest, await read_body(request, body_limits))
        p = req.parameters
        try:
            p.sampling_params()  # bad values are 400s before the prompt is tokenized
        except ValueError as e:
            raise ApiError(400, str(e), param="parameters") from None
        prompt_ids = await encoder.encode(req.inputs, param="inputs")
        max_new = completion_budget(client, prompt_ids, p.asked_max_new_tokens, p.max_new_tokens,
                                    field="max_new_tokens", param="parameters")  # fmt: skip
        return client.submit(prompt_ids, p.sampling_params(max_new), p.stop_strings, endpoint)

    @router.post("/generate")
    async def generate(request: Request):
        stream = await submit(request, "generate")
        try:
            out = await collect(client, stream, request)
        except ClientDisconnected:
            return Response(status_code=499)
        last = out.last
        return JSONResponse({
            "generated_text": [out.text],
            "count_output_tokens": last.num_output_tokens,
            "finish_reason": last.finish_reason,
            "prompt_tokens": last.num_prompt_tokens,
            "mtp": mtp_usage(last.spec),
        })  # fmt: skip

    @router.post("/generate_stream")
    async def generate_stream(request: Request):
        stream = await submit(request, "generate_stream")

        async def events():
            async for d in stream:
                if d.finish_reason == "error":
                    yield error_event(d)
                    return
                token = {
                    "id": d.token_ids[-1] if d.token_ids else None,
                    "ids": d.token_ids,
                    "text": d.text,
                    "logprob": None,
                    "special": False,
                    "count_output_tokens": d.num_output_tokens,
                    "prompt_tokens": d.num_prompt_tokens,
                }
                finished = d.finish_reason is not None
                yield {"token": token, "generated_text": None, "finished": finished,
                       "finish_reason": d.finish_reason, "details": {"mtp": mtp_usage(d.spec)} if finished else None}

        return sse_response(client, stream, events(), done_marker=False)

    return router
