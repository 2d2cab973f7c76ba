"""The FastAPI app: error handling (OpenAI error bodies, never a crash), API-key check, /health, /metrics,
/server_info, and the OpenAI and LightLLM routers."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from lightllm_mtp.multimodal.image_intake import ImageIntake
from lightllm_mtp.server.args import ServerArgs
from lightllm_mtp.server.engine_client import EngineClient
from lightllm_mtp.server.lightllm_api import lightllm_routes
from lightllm_mtp.server.metrics import ServerMetrics
from lightllm_mtp.server.chat_api import chat_routes
from lightllm_mtp.server.chat_output import ChatOptions
from lightllm_mtp.server.openai_api import openai_routes
from lightllm_mtp.server.tokenize_api import tokenize_routes
from lightllm_mtp.server.protocol import ApiError
from lightllm_mtp.server.request_input import BodyLimits, PromptEncoder
from lightllm_mtp.server.responses_api import responses_routes

logger = logging.getLogger("lightllm_mtp.server")


def create_app(args: ServerArgs, client: EngineClient, metrics: ServerMetrics, on_shutdown=None,
               images: ImageIntake | None = None) -> FastAPI:  # fmt: skip
    """images: how chat images are taken (default: as the engine args say, the checkpoint's image processor)."""
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        client.start(asyncio.get_running_loop())
        yield
        client.stop()
        if on_shutdown is not None:  # here, not after uvicorn returns: uvicorn re-raises SIGTERM once it is done
            on_shutdown()

    # FastAPI's own /docs, /redoc and /openapi.json would answer without the API key: off, served below on request
    app = FastAPI(title="lightllm_mtp", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def error(e: ApiError) -> JSONResponse:
        metrics.rejected.labels(str(e.status)).inc()
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return error(e)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        return error(ApiError(e.status_code, str(e.detail), code=str(e.status_code)))

    @app.exception_handler(ClientDisconnect)
    async def client_disconnected(request: Request, e: ClientDisconnect):
        """The client left while its body was read: nothing to answer, nothing went wrong here."""
        metrics.body_disconnects.inc()
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):
        logger.exception("unhandled error in %s %s", request.method, request.url.path)
        return error(ApiError(500, f"internal error: {type(e).__name__}: {e}", type="server_error"))

    async def auth(request: Request) -> None:
        if args.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), args.api_key.encode()):
            raise ApiError(401, "missing or incorrect API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")  # fmt: skip

    if args.enable_api_docs:
        @app.get("/openapi.json", dependencies=[Depends(auth)], include_in_schema=False)
        async def openapi_schema():
            return JSONResponse(app.openapi())

        @app.get("/docs", dependencies=[Depends(auth)], include_in_schema=False)
        async def docs():
            return get_swagger_ui_html(openapi_url="/openapi.json", title="lightllm_mtp")

        @app.get("/redoc", dependencies=[Depends(auth)], include_in_schema=False)
        async def redoc():
            return get_redoc_html(openapi_url="/openapi.json", title="lightllm_mtp")

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        """200 "ok" / "degraded" (some replicas dead, restarting or stalled); 503 "error" (none serves) or
        "draining" (shutting down after SIGTERM: new requests get 503)."""
        status, body = client.health_report()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics_endpoint():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/server_info", dependencies=[Depends(auth)])
    async def server_info():
        e = args.engine
        return {
            "model_name": args.model_name,
            "model_dir": e.model_dir,
            "dp": args.dp,
            "devices": [r.device for r in client.pool.ready],
            "worker_pids": [proc.pid for proc in client.pool.processes],
            "follower_pids": [list(client.follower_pids.get(r, ())) for r in range(args.dp)],  # tp / pp ranks 1..
            "replicas": client.replica_states(),
            "dtype": str(e.dtype).removeprefix("torch."),
            "max_model_len": client.max_model_len,
            "running_max_req_size": e.max_batch_size,
            "chunked_prefill_size": e.chunked_prefill_size,
            "graph_max_batch_size": e.graph_max_batch_size,
            "mtp_mode": e.mtp_mode.value if e.mtp_mode else None,
            "mtp_step": e.mtp_step,
            "mtp_force_acceptance": _forced_acceptance_info(e),
            "prefix_cache": e.prefix_cache,
            "prefix_cache_interval": e.prefix_cache_interval,
            "prefix_cache_state_share": "auto" if e.prefix_cache_state_share is None else e.prefix_cache_state_share,
            "prefix_cache_hit_rate": _hit_rate(client.worker_stats.values()),
            "outstanding": list(client.router.outstanding),
            "workers": [dataclasses.asdict(client.worker_stats[r]) for r in sorted(client.worker_stats)],
            "front": {**client.reader, **{f"loop_{k}": v for k, v in client.loop_lag.items()}},
        }

    if images is None:
        images = ImageIntake.for_engine(args.engine)
    # one tokenizer thread pool for every endpoint, images decoded there too
    encoder = PromptEncoder(client.tokenizer, client.max_model_len, images)
    body = BodyLimits(args.max_request_body_bytes, args.body_timeout_s)
    app.include_router(openai_routes(client, encoder, args.model_name, auth, body))
    chat = ChatOptions(args.reasoning_parser, args.tool_call_parser, args.enable_auto_tool_choice)
    app.include_router(chat_routes(client, encoder, args.model_name, auth, body, chat))
    app.include_router(tokenize_routes(client, encoder, args.model_name, auth, body))
    app.include_router(lightllm_routes(client, encoder, auth, body))
    app.include_router(responses_routes(client, encoder, args.model_name, auth, body, chat))
    return app


def _forced_acceptance_info(e) -> dict | None:
    """Benchmarking's forced acceptance (outputs are not the model's): the setting, the per-position rates it gives
    and the expected accept length per verify step; None when off."""
    forced = e.spec.force_acceptance if e.spec is not None else None
    if forced is None:
        return None
    return {"setting": forced.setting, "rates": list(forced.rates), "mean_accept_length": forced.mean_accept_length,
            "outputs": "drafts accepted without checking: not the model's outputs"}  # fmt: skip


def _hit_rate(stats) -> float:
    """Prompt tokens served from the prefix cache / prompt tokens admitted, over all replicas since start."""
    stats = list(stats)
    prompt = sum(s.cache_prompt_tokens for s in stats)
    return sum(s.cache_cached_tokens for s in stats) / prompt if prompt else 0.0
