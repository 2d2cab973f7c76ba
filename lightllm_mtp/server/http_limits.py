"""What one HTTP connection may hold, so that idle, slowloris and slow-body clients cannot pile up connections.

- Headers: a connection must complete a request's headers within `header_timeout_s` of opening (or, kept alive, of
  the next request's first byte); else it is closed. uvicorn has no such bound: a connection that sends nothing, or
  a header line every few seconds, stays open for good. (Between requests uvicorn's own keep-alive timeout applies.)
- Body: `request_input.read_body` must receive the whole body within `body_timeout_s` (else 408).
- Connections: uvicorn's `limit_concurrency`: past that many open connections (or running requests), new requests
  are answered 503 at once. `default_limit_concurrency` keeps it under the process's file-descriptor limit.
"""

from __future__ import annotations

import asyncio
import resource

from uvicorn.protocols.http.auto import AutoHTTPProtocol  # httptools where installed, else h11

MAX_DEFAULT_CONNECTIONS = 2048
FDS_KEPT_FREE = 128  # workers' pipes and queues, the tokenizer's files, log files


def default_limit_concurrency() -> int:
    """MAX_DEFAULT_CONNECTIONS, or fewer where the open-file limit is lower (a connection is a descriptor)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_DEFAULT_CONNECTIONS
    return max(16, min(MAX_DEFAULT_CONNECTIONS, soft - FDS_KEPT_FREE))


class _HeaderDeadline:
    """Mixed into uvicorn's HTTP protocol (h11 or httptools, both keep the request in flight as `self.cycle`)."""

    header_timeout_s: float

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and self._awaiting_headers():  # the first bytes of a kept-alive next request
            self._arm()
        super().data_received(data)
        if self._header_timer is not None and not self._awaiting_headers():
            self._disarm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _awaiting_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._header_timer = asyncio.get_running_loop().call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        if self._awaiting_headers() and not self.transport.is_closing():
            self.transport.close()


def http_protocol(header_timeout_s: float) -> type:
    """uvicorn's HTTP protocol class (Config(http=...)) with the header deadline."""
    return type("HeaderDeadlineProtocol", (_HeaderDeadline, AutoHTTPProtocol), {"header_timeout_s": header_timeout_s})
