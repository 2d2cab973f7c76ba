"""Starts the model worker processes (spawn), hands out their inboxes and the shared outbox, stops them."""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import time

from lightllm_mtp.server.args import ServerArgs
from lightllm_mtp.server.messages import Shutdown, WorkerFailed, WorkerReady
from lightllm_mtp.server.model_worker import run_worker

logger = logging.getLogger("lightllm_mtp.server")


class WorkerStartError(RuntimeError):
    pass


class WorkerPool:
    def __init__(self, args: ServerArgs):
        self.args = args
        self.ctx = mp.get_context("spawn")  # no forked CUDA or torch state; workers import torch themselves
        self.outbox = self.ctx.Queue()
        self.inboxes = [self.ctx.Queue() for _ in range(args.dp)]
        self.processes = [self._process(rank) for rank in range(args.dp)]
        self.ready: list[WorkerReady] = []
        self._shut_down = False

    def _process(self, rank: int):
        args = self.args
        return self.ctx.Process(
            target=run_worker,
            args=(rank, args.worker_engine_args(rank), args.dp, self.inboxes[rank], self.outbox, args.log_level),
            name=f"lightllm_mtp-worker{rank}",
            daemon=args.engine.parallel.world_size == 1,  # a tp / pp worker starts its follower ranks itself
        )

    def restart(self, rank: int) -> None:
        """Starts replica `rank` again after its worker died (a fresh inbox: the old one may hold a half-written
        message); it reports WorkerReady, or WorkerFailed, on the outbox like at start-up. Call from the thread
        that started the pool (a worker dies with the thread that made it)."""
        if self._shut_down:
            return
        old = self.inboxes[rank]
        old.cancel_join_thread()
        old.close()
        self.inboxes[rank] = self.ctx.Queue()
        self.processes[rank] = self._process(rank)
        self.processes[rank].start()

    def start(self, timeout_s: float = 3600.0) -> list[WorkerReady]:
        """Starts every worker and waits until each has loaded its model; raises WorkerStartError otherwise."""
        for p in self.processes:
            p.start()
        ready: dict[int, WorkerReady] = {}
        deadline = time.monotonic() + timeout_s
        while len(ready) < len(self.processes):
            try:
                msg = self.outbox.get(timeout=1.0)
            except queue.Empty:
                dead = [p.name for p in self.processes if not p.is_alive()]
                if dead:
                    try:  # a worker that reported its failure and exited: its message can land just after the wait
                        msg = self.outbox.get(timeout=1.0)
                    except queue.Empty:
                        names = ", ".join(dead)
                        raise WorkerStartError(f"{names} exited during start-up (see its log above)") from None
                elif time.monotonic() > deadline:
                    raise WorkerStartError(f"workers not ready after {timeout_s:.0f} s") from None
                else:
                    continue
            if isinstance(msg, WorkerFailed):
                raise WorkerStartError(f"worker {msg.rank} failed to start: {msg.error}")
            if isinstance(msg, WorkerReady):
                ready[msg.rank] = msg
                logger.info("worker %d ready on %s", msg.rank, msg.device)
        self.ready = [ready[r] for r in range(len(self.processes))]
        return self.ready

    def send(self, rank: int, msg) -> None:
        if self._shut_down:  # late aborts of handlers finishing during shutdown: nobody reads them any more
            return
        try:
            self.inboxes[rank].put(msg)
        except ValueError:  # the queue was closed by a restart or the shutdown in between
            pass

    def dead_workers(self) -> list[int]:
        return [rank for rank, p in enumerate(self.processes) if p.pid is not None and not p.is_alive()]

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Asks every worker to stop, terminates those that do not; safe to call twice."""
        if self._shut_down:
            return
        self._shut_down = True
        for rank, p in enumerate(self.processes):
            if p.is_alive():
                self.inboxes[rank].put(Shutdown())
        deadline = time.monotonic() + timeout_s
        for p in self.processes:
            if p.pid is None:
                continue
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                logger.warning("%s did not stop; terminating it", p.name)
                p.terminate()
                p.join(2.0)
        for q in [self.outbox, *self.inboxes]:
            q.cancel_join_thread()  # do not block exit on messages nobody will read
            q.close()
