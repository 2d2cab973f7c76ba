"""uvicorn's server with a clean drain on SIGTERM / SIGINT.

New requests get 503 at once; running ones get `grace_s` to finish, then fail with an OpenAI error body or a stream
error event (followed by `[DONE]`); only then does uvicorn close the connections and stop, and the workers are shut
down. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import time

import uvicorn

from lightllm_mtp.server.engine_client import EngineClient

logger = logging.getLogger("lightllm_mtp.server")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, client: EngineClient, grace_s: float):
        super().__init__(config)
        self.client, self.grace_s = client, grace_s
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)

    def handle_exit(self, sig, frame) -> None:
        if self._draining or self._loop is None:
            return super().handle_exit(sig, frame)
        self._draining = True
        self.client.draining = True
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._drain()))

    async def _drain(self) -> None:
        client = self.client
        logger.info("draining: %d requests running, %.1f s to finish", client.in_flight, self.grace_s)
        deadline = time.monotonic() + self.grace_s
        while client.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if client.in_flight:
            logger.info("failing %d requests still running", client.in_flight)
            client.fail_in_flight("the server is shutting down")
            while client.in_flight and time.monotonic() < deadline + 5:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)  # the handlers send their error bodies and events
        self.should_exit = True
