"""The front's side of the workers: validates and submits requests, routes them, and turns the workers' token
deltas into text deltas for the HTTP handlers.

Threads: route handlers call `submit` / `abort` on the event loop; one reader thread takes `WorkerOutput`s from
the workers' outbox pipes, detokenizes (stop strings included), updates metrics and hands each request's `Delta` to
its `RequestStream` on the loop (`call_soon_threadsafe`). A request ends exactly once: its worker's last delta,
a stop string found here (the worker is then told to abort), or its replica going down.

A replica goes down when its worker dies (its pipe ends, or its process is found gone) or when the watchdog finds it
silent with work for longer than --worker_watchdog_s (replica_health.py; its processes are then killed). Its requests
that produced nothing yet are sent to a live replica once (the client saw nothing: a request routed to a worker that
had just died is served elsewhere); the others fail with an error naming the cause. The replica is restarted.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from dataclasses import dataclass

from lightllm_mtp.multimodal.image_input import ImageInput
from lightllm_mtp.sampling_params import SamplingParams
from lightllm_mtp.engine.detokenizer import IncrementalDetokenizer
from lightllm_mtp.server.messages import (
    AbortRequest,
    AddRequest,
    TokenDelta,
    WorkerFailed,
    WorkerOutput,
    WorkerReady,
    WorkerStats,
)
from lightllm_mtp.server.metrics import ServerMetrics
from lightllm_mtp.server.protocol import ApiError
from lightllm_mtp.server.replica_health import ReplicaHealth
from lightllm_mtp.server.router import Router
from lightllm_mtp.server.worker_pool import WorkerPool
from lightllm_mtp.spec_decode.stats import SpecStats

logger = logging.getLogger("lightllm_mtp.server")
WORKER_CHECK_S = 0.5  # how often the reader looks for dead workers


@dataclass(frozen=True)
class Delta:
    """What one worker step produced for one request, as the HTTP handler sees it."""

    text: str  # newly released text (may be empty: held back, or special tokens)
    token_ids: list[int]
    finish_reason: str | None  # on the last delta: "stop" | "length" | "abort" | "error"
    error: str | None
    num_prompt_tokens: int
    num_output_tokens: int  # generated so far
    spec: SpecStats | None  # on the last delta of an MTP request
    num_cached_tokens: int = 0  # on the last delta: prompt tokens served from the prefix cache
    logprobs: list | None = None  # params.logprobs: one (logprob, top pairs) per token of token_ids
    num_image_tokens: int = 0  # of num_prompt_tokens, those of the prompt's images


class RequestStream:
    def __init__(self, rid: int, rank: int, prompt_ids: list[int], params: SamplingParams,
                 detok: IncrementalDetokenizer, images: tuple[ImageInput, ...] = ()):  # fmt: skip
        self.rid, self.rank = rid, rank
        # to send it again if its replica goes down before it starts
        self.prompt_ids, self.params, self.images = prompt_ids, params, images
        self.rerouted = False
        self.num_prompt_tokens = len(prompt_ids)
        self.num_image_tokens = sum(image.num_tokens for image in images)
        self.queue: asyncio.Queue[Delta] = asyncio.Queue()
        self.finished = False  # the last delta was taken by the handler
        self.aborted = False
        # a stop string matched: the worker is told to abort, and its answer (with the request's MTP counts) ends
        # the stream as "stop"
        self.stopping = False
        # owned by the reader thread
        self.detok = detok
        self.num_output_tokens = 0
        self.arrival = time.monotonic()
        self.first_token_at: float | None = None

    async def get(self) -> Delta:
        delta = await self.queue.get()
        self.finished = delta.finish_reason is not None
        return delta

    async def __aiter__(self):
        while not self.finished:
            yield await self.get()


class EngineClient:
    def __init__(self, pool: WorkerPool, tokenizer, metrics: ServerMetrics):
        self.pool = pool
        self.tokenizer = tokenizer
        self.metrics = metrics
        info = pool.ready[0]
        self.max_model_len = info.max_model_len
        self.vocab_size = info.vocab_size
        self.image_token_id = info.image_token_id  # None: the workers take no images
        self.mtp_step = info.mtp_step
        self.kv_capacity = info.stats.kv_capacity
        self.kv_lookahead_slots = info.kv_lookahead_slots
        self.router = Router(len(pool.ready))
        self.worker_stats: dict[int, WorkerStats] = {r.rank: r.stats for r in pool.ready}
        self.follower_pids = {r.rank: r.follower_pids for r in pool.ready}
        args = pool.args
        self.health = ReplicaHealth(len(pool.ready), args.worker_stall_s, args.worker_watchdog_s)
        self.dead, self.restarting = self.health.dead, self.health.restarting  # replicas not serving
        self.restarts_left = {r: args.worker_restart_attempts for r in range(len(pool.ready))}
        self._restart_generation: dict[int, int] = {}  # rank -> the pool's generation when its restart was asked
        self.draining = False  # shutting down: new requests get 503, running ones finish or fail
        self._fail_pending: str | None = None
        self._streams: dict[int, RequestStream] = {}
        self._rids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        # the reader thread's load (/server_info "front"): outputs read, seconds from a worker's put to the read
        # (summed, and the largest), seconds spent turning outputs into stream deltas
        self.reader = {"outputs": 0, "lag_s": 0.0, "max_lag_s": 0.0, "busy_s": 0.0}
        self.loop_lag = {"deliveries": 0, "lag_s": 0.0}  # reader -> event loop hand-offs and their wait
        self._reader = threading.Thread(target=self._read, name="lightllm_mtp-outputs", daemon=True)
        metrics.watch_workers(lambda: [self.worker_stats[r] for r in sorted(self.worker_stats)],
                              lambda: list(self.router.outstanding))  # fmt: skip

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._reader.start()

    def stop(self) -> None:
        self._stop.set()
        if self._reader.is_alive():
            self._reader.join(timeout=5.0)

    def replica_states(self) -> list[str]:
        """Per replica: "ok", "stalled" (silent with work past --worker_stall_s), "dead" or "restarting"."""
        return self.health.states(list(self.router.outstanding))

    def health_report(self) -> tuple[int, dict]:
        """/health's (HTTP status, body), replica_health.ReplicaHealth.report."""
        return self.health.report(list(self.router.outstanding), self.draining)

    def _pick(self) -> int | None:
        """A replica for a request: the least loaded that serves; with none, a stalled one (the request waits
        behind its step); None when every replica is down."""
        outstanding = list(self.router.outstanding)
        rank = self.router.pick(down=self.dead | self.health.stalled(outstanding))
        if rank is None:
            rank = self.router.pick(down=set(self.dead))
        if rank is not None:
            self.health.got_work(rank, self.router.outstanding[rank])
        return rank

    # ---- event-loop side -----------------------------------------------------------------------------------
    def validate(self, prompt_ids: list[int], max_new_tokens: int, logit_bias=(),
                 images: tuple[ImageInput, ...] = ()) -> None:  # fmt: skip
        n = len(prompt_ids)
        if n == 0:
            raise ApiError(400, "the prompt is empty", param="prompt")
        if n >= self.max_model_len:
            raise ApiError(400, f"the prompt has {n} tokens; this model's maximum context length is "
                           f"{self.max_model_len} (prompt + at least one generated token)", param="prompt",
                           code="context_length_exceeded")  # fmt: skip
        bad = [t for t in prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ApiError(400, f"token ids out of range [0, {self.vocab_size}): {bad[:8]}", param="prompt")
        self._validate_image_tokens(prompt_ids, images)
        bad = [t for t, _ in logit_bias if t >= self.vocab_size]
        if bad:
            raise ApiError(400, f"logit_bias token ids out of range [0, {self.vocab_size}): {bad[:8]}",
                           param="logit_bias")  # fmt: skip
        need = min(n + max_new_tokens, self.max_model_len) + self.kv_lookahead_slots  # as the worker's Scheduler
        if need > self.kv_capacity:
            raise ApiError(400, f"the request needs {need} KV tokens, a replica's pool holds {self.kv_capacity}: "
                           "lower max_tokens", param="max_tokens")  # fmt: skip

    def _validate_image_tokens(self, prompt_ids: list[int], images: tuple[ImageInput, ...]) -> None:
        """The prompt's image tokens are exactly its images' (a text prompt naming <|image_pad|> has no image)."""
        if self.image_token_id is None:
            if images:
                raise ApiError(400, "this server takes no images", param="messages")
            return
        found, expected = prompt_ids.count(self.image_token_id), sum(image.num_tokens for image in images)
        if found != expected:
            hint = " (images are sent as image_url content parts to /v1/chat/completions)" if not images else ""
            raise ApiError(400, f"the prompt holds {found} image tokens (id {self.image_token_id}); its "
                           f"{len(images)} images have {expected}{hint}", param="prompt")  # fmt: skip

    def submit(self, prompt_ids: list[int], params: SamplingParams, stop: tuple[str, ...] = (),
               endpoint: str = "", images: tuple[ImageInput, ...] = ()) -> RequestStream:  # fmt: skip
        """Validates (ApiError on bad input), then hands the request to the least loaded replica. images: the
        prompt's, in order, each placeholder in prompt_ids already expanded to its tokens."""
        self.validate(prompt_ids, params.max_new_tokens, params.logit_bias, images)
        if self.draining:
            raise ApiError(503, "the server is shutting down", type="server_error", code="shutting_down")
        rank = self._pick()
        if rank is None:
            raise ApiError(503, f"no model worker is serving (replicas {self.replica_states()})",
                           type="server_error")  # fmt: skip
        rid = next(self._rids)
        detok = IncrementalDetokenizer(self.tokenizer, prompt_ids, stop, params.include_stop_str_in_output,
                                       params.min_tokens)  # fmt: skip
        stream = RequestStream(rid, rank, prompt_ids, params, detok, tuple(images))
        self._streams[rid] = stream  # before the worker can answer
        self.metrics.requests.labels(endpoint).inc()
        self.metrics.prompt_tokens.inc(len(prompt_ids))
        self.pool.send(rank, AddRequest(rid, list(prompt_ids), params, tuple(images)))
        return stream

    def abort(self, stream: RequestStream) -> None:
        """Client gone: the worker frees the request's slots and answers with its last delta (ignored)."""
        if stream.finished or stream.aborted:
            return
        stream.aborted = True
        if stream.rid in self._streams:
            self.pool.send(stream.rank, AbortRequest(stream.rid))

    # ---- reader thread -------------------------------------------------------------------------------------
    def _read(self) -> None:
        last_check = time.monotonic()
        while not self._stop.is_set():
            if self._fail_pending is not None:
                error, self._fail_pending = self._fail_pending, None
                self._fail(list(self._streams.values()), lambda s: error)
            ended: list[int] = []
            try:
                messages, ended = self.pool.receive(0.05 if self._fail_pending is not None else WORKER_CHECK_S)
                for out in messages:
                    self._on_message(out)
                if ended or time.monotonic() - last_check > WORKER_CHECK_S:  # also while other replicas talk
                    last_check = time.monotonic()
                    self._check_workers(ended)
            except Exception:  # never lose the reader: every later request would hang
                logger.exception("the output reader failed a turn")

    def _on_message(self, out) -> None:
        if isinstance(out, WorkerOutput):
            if out.rank in self.dead:  # the last words of a replica already declared down (its requests moved on)
                return
            self.health.heard(out.rank)
            try:
                self._on_output(out)
            except Exception:
                logger.exception("failed to process worker %d output", out.rank)
        elif isinstance(out, WorkerReady):  # a restarted replica has loaded its model
            logger.info("worker %d restarted on %s", out.rank, out.device)
            self.worker_stats[out.rank] = out.stats
            self.follower_pids[out.rank] = out.follower_pids
            self.health.heard(out.rank)
            self.restarting.discard(out.rank)
            self.dead.discard(out.rank)
        elif isinstance(out, WorkerFailed):
            logger.error("worker %d failed to restart: %s", out.rank, out.error)
            self.restarting.discard(out.rank)
            self._restart(out.rank)

    def _on_output(self, out: WorkerOutput) -> None:
        self.worker_stats[out.rank] = out.stats
        now = time.monotonic()
        lag = now - out.sent_at
        self.reader["outputs"] += 1
        self.reader["lag_s"] += lag
        self.reader["max_lag_s"] = max(self.reader["max_lag_s"], lag)
        posts = []
        for d in out.deltas:
            stream = self._streams.get(d.rid)
            if stream is not None and stream.rank != out.rank:  # it was sent to another replica since
                continue
            delta = self._advance(stream, d, now) if stream is not None else None  # None: it ended already
            if delta is not None:
                posts.append((stream, delta))
        if posts:
            self._post(posts)
        self.reader["busy_s"] += time.monotonic() - now

    def _advance(self, stream: RequestStream, d: TokenDelta, now: float) -> Delta | None:
        if stream.stopping:  # tokens past the stop string are dropped; the worker's last delta ends the stream
            if d.finish_reason is None:
                return None
            self._end(stream, "stop", now, d.spec)
            return Delta("", [], "stop", None, stream.num_prompt_tokens, stream.num_output_tokens, d.spec,
                         d.num_cached_tokens, num_image_tokens=stream.num_image_tokens)  # fmt: skip
        reason = d.finish_reason
        text = stream.detok.push(d.token_ids, final=reason is not None)
        token_ids = d.token_ids[: stream.detok.used]  # not the tokens past a stop string within this step
        logprobs = d.logprobs[: len(token_ids)] if d.logprobs is not None else None
        if token_ids:
            if stream.first_token_at is None:
                stream.first_token_at = now
                self.metrics.on_first_token(now - stream.arrival)
            stream.num_output_tokens += len(token_ids)
            self.metrics.on_tokens(len(token_ids))
        if reason is None and stream.detok.stopped:  # the text up to the stop string now, the end with the counts
            stream.stopping = True
            self.pool.send(stream.rank, AbortRequest(stream.rid))
        if reason is not None and stream.detok.stopped:
            reason = "stop"  # the worker ended it in the same step (length, eos) after the stop string
        if reason is not None:
            self._end(stream, reason, now, d.spec)
        return Delta(text, token_ids, reason, d.error, stream.num_prompt_tokens, stream.num_output_tokens, d.spec,
                     d.num_cached_tokens, logprobs, stream.num_image_tokens)  # fmt: skip

    def _end(self, stream: RequestStream, reason: str, now: float, spec: SpecStats | None) -> None:
        del self._streams[stream.rid]
        self.router.done(stream.rank)
        n, first = stream.num_output_tokens, stream.first_token_at
        tpot = (now - first) / (n - 1) if first is not None and n > 1 else None
        self.metrics.on_finish(reason, now - stream.arrival, tpot, spec)

    def _check_workers(self, ended: list[int] = ()) -> None:
        """Replicas whose worker is gone (its pipe ended, or its process), or silent with work past the watchdog:
        down. A restart whose new worker died before it reported is tried again."""
        gone = set(ended) | set(self.pool.dead_workers())
        for rank in sorted(gone - self.dead):
            logger.error("model worker %d died", rank)
            self._replica_down(rank, f"model worker {rank} died")
        for rank in sorted(gone & self.restarting):
            if self.pool.generations[rank] > self._restart_generation.get(rank, -1):  # the new one died, unreported
                logger.error("worker %d died while restarting", rank)
                self.restarting.discard(rank)
                self._restart(rank)
        for rank in self.health.overdue(list(self.router.outstanding)):
            silent = self.health.silent_s(rank)
            logger.error("model worker %d sent nothing for %.0f s while it had %d requests (--worker_watchdog_s "
                         "%.0f): ending and restarting it", rank, silent, self.router.outstanding[rank],
                         self.health.watchdog_s)  # fmt: skip
            self.pool.kill(rank, self.follower_pids.get(rank, ()))
            self._replica_down(rank, f"model worker {rank} stopped answering (nothing for {silent:.0f} s, "
                                     f"--worker_watchdog_s {self.health.watchdog_s:.0f}); it is being restarted")

    def _replica_down(self, rank: int, error: str) -> None:
        """Marks `rank` dead and restarts it; its requests that produced nothing yet go to a live replica (once),
        the others fail with `error`."""
        self.dead.add(rank)
        self._restart(rank)
        failed = []
        for stream in [s for s in self._streams.values() if s.rank == rank]:
            if not self._reroute(stream):
                failed.append(stream)
        self._fail(failed, lambda s: error)

    def _reroute(self, stream: RequestStream) -> bool:
        """Sends a request its client has seen nothing of to another replica; False when it cannot be."""
        if stream.rerouted or stream.num_output_tokens or stream.stopping or stream.aborted:
            return False
        rank = self._pick()
        if rank is None:
            return False
        self.router.done(stream.rank)
        stream.rank, stream.rerouted = rank, True
        self.pool.send(rank, AddRequest(stream.rid, list(stream.prompt_ids), stream.params, stream.images))
        logger.info("request %d moved to replica %d", stream.rid, rank)
        return True

    def _fail(self, streams: list[RequestStream], error) -> None:
        """Ends `streams` with an error delta (the handler answers an OpenAI error body or a stream error event)."""
        now, posts = time.monotonic(), []
        for stream in list(streams):
            self._end(stream, "error", now, None)
            posts.append((stream, Delta("", [], "error", error(stream), stream.num_prompt_tokens,
                                        stream.num_output_tokens, None, num_image_tokens=stream.num_image_tokens)))
        if posts:
            self._post(posts)

    # ---- shutdown ------------------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._streams)

    def fail_in_flight(self, error: str) -> None:
        """Fails every request still running, from the reader thread (which owns the streams) at its next turn."""
        self._fail_pending = error

    def _restart(self, rank: int) -> None:
        """Starts a dead replica again while attempts are left (on the event loop's thread, which made the pool)."""
        if self.restarts_left[rank] <= 0 or self._loop is None or self._stop.is_set():
            return
        self.restarts_left[rank] -= 1
        self.restarting.add(rank)
        self._restart_generation[rank] = self.pool.generations[rank]
        logger.warning("restarting worker %d (%d attempts left)", rank, self.restarts_left[rank])
        self._loop.call_soon_threadsafe(self.pool.restart, rank)

    def _post(self, posts: list[tuple[RequestStream, Delta]]) -> None:
        posted = time.monotonic()

        def deliver():  # on the event loop: how long the loop took to get to it is its backlog
            self.loop_lag["deliveries"] += 1
            self.loop_lag["lag_s"] += time.monotonic() - posted
            for stream, delta in posts:
                stream.queue.put_nowait(delta)

        self._loop.call_soon_threadsafe(deliver)
