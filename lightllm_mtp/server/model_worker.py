"""A model worker: one process owning one `LLMEngine` (one replica of the model).

The loop: take new requests and aborts from the inbox (block only when idle), run one `engine.step_outputs()`,
push the step's new token ids, finish reasons, acceptance and pool usage to the outbox (this worker's own pipe,
worker_channels.py), and, while it has work, at least every HEARTBEAT_S (the front's watchdog takes a replica silent
with work for too long for dead). Speculative decoding is the engine's business (its runner is a SpecRunner when MTP
is on): nothing here depends on it.
"""

from __future__ import annotations

import cProfile
import ctypes
import logging
import os
import platform
import queue
import signal
import sys
import time
import traceback

from lightllm_mtp.env import ENV
from lightllm_mtp.server.messages import (
    AbortRequest,
    AddRequest,
    Shutdown,
    TokenDelta,
    WorkerFailed,
    WorkerOutput,
    WorkerReady,
    WorkerStats,
)
from lightllm_mtp.spec_decode.stats import SpecStats

logger = logging.getLogger("lightllm_mtp.worker")
PARENT_CHECK_S = 1.0  # an idle worker checks this often that the front is still alive
HEARTBEAT_S = 1.0  # a busy worker reports at least this often between steps (replica_health.py)
FLUSH_S = 2.0  # on exit, how long the last messages may take to reach the pipe


def run_worker(rank: int, engine_args, dp: int, inbox, outbox, log_level: str) -> None:
    """Process entry point (multiprocessing spawn target)."""
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the front died before the death signal was armed
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the front shuts us down
    logging.basicConfig(level=log_level.upper(), format=f"%(asctime)s worker{rank} %(levelname)s %(message)s")
    try:
        worker = ModelWorker(rank, engine_args, dp, inbox, outbox)
    except Exception as e:  # reported to the front, which prints it and exits
        logger.error("start-up failed:\n%s", traceback.format_exc())
        outbox.put(WorkerFailed(rank, f"{type(e).__name__}: {e}"))
        outbox.flush(FLUSH_S)  # in the pipe before the process ends (its own pipe: nobody else's is touched)
        return
    if ENV.worker_profile:
        profiler = cProfile.Profile()
        served = profiler.runcall(worker.run)
        profiler.dump_stats(f"{ENV.worker_profile}.rank{rank}")
    else:
        served = worker.run()
    if not served:  # the front is gone, or the tp / pp group ended (its requests' failures are on their way)
        worker.outbox.flush(FLUSH_S)
        os._exit(0)
    worker.engine.shutdown()  # tp / pp: ends the follower ranks


def _die_with_parent() -> None:
    """Linux: the kernel sends SIGKILL when the front process dies (kill -9 included), whatever this process is
    doing; a busy step or a write blocked on the full outbox pipe cannot keep it alive. Elsewhere the loop's
    parent check below is the only guard."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        logger.warning("prctl(PR_SET_PDEATHSIG) unavailable: the worker checks for its front once a second")


class ModelWorker:
    def __init__(self, rank: int, engine_args, dp: int, inbox, outbox):
        import torch

        from lightllm_mtp.engine.llm_engine import LLMEngine
        from lightllm_mtp.engine.warm_up import warm_up

        if engine_args.device.type == "cuda" and engine_args.device.index is not None:
            torch.cuda.set_device(engine_args.device)  # graphs, streams and Triton launches on our GPU
        self.rank = rank
        self.inbox, self.outbox = inbox, outbox
        self.parent_pid = os.getppid()
        self.engine = LLMEngine(engine_args)
        if engine_args.device.type == "cuda" and engine_args.warm_up:
            warm_up(self.engine)
        self.group_failed = False
        self.live: dict[int, object] = {}  # server rid -> engine Request
        self.rid_of: dict[int, int] = {}  # engine request_id -> server rid
        self.finished_requests = 0
        self.generated_tokens = 0
        self.spec_done = SpecStats()  # acceptance of requests that ended
        self.steps, self.step_s = 0, 0.0  # engine steps and the seconds spent in them
        dev = engine_args.device
        if dev.type == "cuda":
            name = torch.cuda.get_device_name(dev)
        else:
            name = f"{platform.machine()}, {torch.get_num_threads()} threads"
        spec = self.engine.spec
        group = self.engine.parallel_group
        vision = self.engine.model_config.vision  # None where this engine takes no images
        outbox.put(
            WorkerReady(
                rank=rank,
                device=f"{dev} ({name})",
                max_model_len=self.engine.max_model_len,
                vocab_size=self.engine.model_config.vocab_size,
                eos_token_ids=tuple(sorted(self.engine.eos_token_ids)),
                mtp_step=spec.num_draft_tokens if spec else 0,
                kv_lookahead_slots=self.engine.scheduler.lookahead_slots,
                stats=self._stats(),
                follower_pids=tuple(p.pid for p in group.procs) if group is not None else (),
                image_token_id=vision.image_token_id if vision is not None else None,
            )
        )

    def run(self) -> bool:
        """Serves until the front says Shutdown (True) or is found gone (False)."""
        last_check = last_sent = time.monotonic()
        while True:
            msgs = self._receive(block=not self.engine.has_unfinished())
            if msgs is None:
                return False
            if time.monotonic() - last_check > PARENT_CHECK_S:  # also while busy
                last_check = time.monotonic()
                if os.getppid() != self.parent_pid:
                    logger.warning("the front process is gone; exiting")
                    return False
            deltas: list[TokenDelta] = []
            for msg in msgs:
                if isinstance(msg, Shutdown):
                    return True
                deltas += self._handle(msg)
            busy = self.engine.has_unfinished()
            if busy:
                deltas += self._step()
            now = time.monotonic()
            if msgs or deltas or (busy and now - last_sent > HEARTBEAT_S):
                self.outbox.put(WorkerOutput(self.rank, deltas, self._stats(), now))
                last_sent = now
            if self.group_failed:  # a tp / pp rank died or hung: leave, so that the front restarts the replica
                logger.error("the replica's tp/pp group ended; exiting for a restart")
                return False

    def _receive(self, block: bool) -> list | None:
        """Everything in the inbox now; when idle, waits for the first message. None: the front is gone."""
        msgs = []
        while block and not msgs:
            try:
                msgs.append(self.inbox.get(timeout=PARENT_CHECK_S))
            except queue.Empty:
                if os.getppid() != self.parent_pid:
                    logger.warning("the front process is gone; exiting")
                    return None
        while True:
            try:
                msgs.append(self.inbox.get_nowait())
            except queue.Empty:
                return msgs

    def _handle(self, msg) -> list[TokenDelta]:
        if isinstance(msg, AddRequest):
            try:
                req = self.engine.add_request(msg.prompt_ids, msg.params, images=msg.images)
            except Exception as e:  # the front validates first; this is the last line of defence
                self.finished_requests += 1
                return [TokenDelta(msg.rid, [], "error", error=f"{type(e).__name__}: {e}")]
            self.live[msg.rid] = req
            self.rid_of[req.request_id] = msg.rid
            return []
        if isinstance(msg, AbortRequest):
            req = self.live.get(msg.rid)
            if req is None:  # already finished: its last delta is on its way
                return []
            self.engine.abort(req)
            return [self._last_delta(msg.rid, req, [], "abort")]
        raise TypeError(f"unexpected message {msg!r}")

    def _step(self) -> list[TokenDelta]:
        start = time.monotonic()
        try:
            outputs = self.engine.step_outputs()
        except Exception as e:  # a failing step must not take the server down: fail its requests, go on
            logger.error("step failed, aborting %d requests:\n%s", len(self.live), traceback.format_exc())
            from lightllm_mtp.engine.parallel.group import ParallelGroupError  # loaded with the engine

            self.group_failed = isinstance(e, ParallelGroupError)
            return self._fail_all(f"{type(e).__name__}: {e}")
        self.steps += 1
        self.step_s += time.monotonic() - start
        deltas = []
        for o in outputs:
            rid = self.rid_of[o.request.request_id]
            self.generated_tokens += len(o.new_token_ids)
            if o.finished:
                deltas.append(self._last_delta(rid, o.request, o.new_token_ids, o.request.finish_reason.value,
                                               o.request.error, o.new_logprobs))  # fmt: skip
            else:
                deltas.append(TokenDelta(rid, o.new_token_ids, logprobs=o.new_logprobs))
        return deltas

    def _fail_all(self, error: str) -> list[TokenDelta]:
        deltas = []
        for rid, req in list(self.live.items()):
            try:
                self.engine.abort(req)
            except Exception:
                logger.error("abort after a failed step failed:\n%s", traceback.format_exc())
            deltas.append(self._last_delta(rid, req, [], "error", error))
        return deltas

    def _last_delta(self, rid: int, req, token_ids: list[int], reason: str, error: str | None = None,
                    logprobs: list | None = None) -> TokenDelta:  # fmt: skip
        """The request's final delta; it leaves the live set."""
        del self.live[rid], self.rid_of[req.request_id]
        self.finished_requests += 1
        spec = req.spec_stats if self.engine.spec else None
        if spec is not None:
            self.spec_done = self.spec_done + spec
        return TokenDelta(rid, token_ids, reason, error=error, spec=spec, num_cached_tokens=req.num_cached_tokens,
                          logprobs=logprobs)  # fmt: skip

    def _stats(self) -> WorkerStats:
        u = self.engine.usage()
        spec = self.spec_done
        if self.engine.spec:
            for req in self.live.values():
                spec = spec + req.spec_stats
        return WorkerStats(
            rank=self.rank,
            kv_used=u.kv_used,
            kv_capacity=u.kv_capacity,
            kv_reserved=u.kv_reserved,
            req_slots_used=u.req_slots_used,
            req_slots_capacity=u.req_slots_capacity,
            running=u.running,
            waiting=u.waiting,
            finished_requests=self.finished_requests,
            generated_tokens=self.generated_tokens,
            spec=spec,
            steps=self.steps,
            step_s=self.step_s,
            **self._cache_stats(),
        )

    def _cache_stats(self) -> dict:
        c = self.engine.prefix_cache_stats()
        if c is None:
            return {}
        return dict(cache_queries=c.queries, cache_hits=c.hits, cache_prompt_tokens=c.prompt_tokens,
                    cache_cached_tokens=c.cached_tokens, kv_cached=c.tree_tokens, cache_snapshots=c.snapshots,
                    cache_snapshot_capacity=c.snapshot_capacity, cache_host_snapshots=c.host_snapshots,
                    cache_host_fetches=c.host_fetches)  # fmt: skip
