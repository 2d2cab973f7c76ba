"""The app's answers that need no model (a real EngineClient over a stand-in pool, called through ASGI): a client that
leaves while its body is read (issue 35 item 4), a body that arrives too slowly (item 6), /health on HEAD and while
draining (item 7)."""

import asyncio
import logging

import httpx
import pytest
from transformers import AutoTokenizer

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.server.args import ServerArgs
from lightllm_mtp.server.engine_client import EngineClient
from lightllm_mtp.server.http_app import create_app
from lightllm_mtp.server.metrics import ServerMetrics
from unit_tests.server.stand_in_pool import StandInPool

BODY_TIMEOUT_S = 0.5


@pytest.fixture
def app(trained_dense_dir):
    args = ServerArgs(engine=EngineArgs(model_dir=str(trained_dense_dir)), model_name="m", body_timeout_s=BODY_TIMEOUT_S)
    client = EngineClient(StandInPool(), AutoTokenizer.from_pretrained(str(trained_dense_dir)), ServerMetrics(0))
    return create_app(args, client, client.metrics), client


def post_partly(app, chunks: list[bytes], then: str) -> list[dict]:
    """POST /v1/completions announcing 1000 bytes, sending `chunks`, then "disconnect" or "stall"."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"1000")],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}  # fmt: skip
    incoming = [{"type": "http.request", "body": c, "more_body": True} for c in chunks]
    sent = []

    async def receive():
        if incoming:
            return incoming.pop(0)
        if then == "disconnect":
            return {"type": "http.disconnect"}
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    return sent


def counter(client, name: str, label: str | None = None) -> float:
    labels = {"status": label} if label else {}
    return client.metrics.registry.get_sample_value(f"lightllm_mtp_{name}_total", labels) or 0.0


def test_a_client_leaving_while_its_body_is_read_is_no_error(app, caplog):
    app, client = app
    with caplog.at_level(logging.INFO):
        sent = post_partly(app, [b'{"prompt": "def f'], then="disconnect")
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    assert counter(client, "request_body_disconnects") == 1 and counter(client, "requests_rejected", "500") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_body_that_arrives_too_slowly_gets_408(app):
    app, client = app
    sent = post_partly(app, [b'{"prompt": '], then="stall")
    assert sent[0]["status"] == 408 and b'"request_timeout"' in sent[1]["body"]


def test_health_answers_head_and_says_draining(app):
    app, client = app

    async def ask():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            return [await http.head("/health"), await http.get("/health")]

    head, get = asyncio.run(ask())
    assert head.status_code == 200 and get.json() == {"status": "ok", "replicas": ["ok", "ok"]}
    client.draining = True  # SIGTERM (draining.py)
    head, get = asyncio.run(ask())
    assert head.status_code == 503 and get.status_code == 503 and get.json()["status"] == "draining"


def test_the_default_connection_limit_stays_under_the_open_file_limit(monkeypatch):
    import resource

    from lightllm_mtp.server import http_limits

    for soft, want in [(1024, 1024 - http_limits.FDS_KEPT_FREE), (1 << 20, 2048), (resource.RLIM_INFINITY, 2048)]:
        monkeypatch.setattr(resource, "getrlimit", lambda kind, soft=soft: (soft, resource.RLIM_INFINITY))
        assert http_limits.default_limit_concurrency() == want
