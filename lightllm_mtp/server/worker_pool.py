"""Starts the model worker processes (spawn), hands out their inboxes and each one's own outbox pipe
(worker_channels.py), stops them."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time

from lightllm_mtp.server.args import ServerArgs
from lightllm_mtp.server.messages import Shutdown, WorkerFailed, WorkerReady
from lightllm_mtp.server.model_worker import run_worker
from lightllm_mtp.server.worker_channels import close_after_start, open_channel, receive

logger = logging.getLogger("lightllm_mtp.server")


class WorkerStartError(RuntimeError):
    pass


class WorkerPool:
    def __init__(self, args: ServerArgs, target=run_worker):
        """target: the worker's entry point (run_worker; tests pass stand-ins with its signature)."""
        self.args = args
        self.target = target
        self.ctx = mp.get_context("spawn")  # no forked CUDA or torch state; workers import torch themselves
        self.inboxes = [self.ctx.Queue() for _ in range(args.dp)]
        self.outboxes: list = [None] * args.dp  # the front's read end of each worker's pipe (a restart makes a new one)
        self._worker_ends: list = [None] * args.dp
        self.generations = [0] * args.dp  # restarts of each replica so far
        self.processes = [self._process(rank) for rank in range(args.dp)]
        self.ready: list[WorkerReady] = []
        self._watched: dict[int, object] = {}  # the pipes `receive` waits on (owned by the thread that calls it)
        self._shut_down = False

    def _process(self, rank: int):
        args = self.args
        self.outboxes[rank], self._worker_ends[rank] = open_channel(self.ctx)
        return self.ctx.Process(
            target=self.target,
            args=(rank, args.worker_engine_args(rank), args.dp, self.inboxes[rank], self._worker_ends[rank],
                  args.log_level),
            name=f"lightllm_mtp-worker{rank}",
            daemon=args.engine.parallel.world_size == 1,  # a tp / pp worker starts its follower ranks itself
        )  # fmt: skip

    def _start(self, rank: int) -> None:
        self.processes[rank].start()
        close_after_start(self._worker_ends[rank])  # the worker holds the only write end: its exit ends the pipe

    def restart(self, rank: int) -> None:
        """Starts replica `rank` again after its worker died (a fresh inbox: the old one may hold a half-written
        message; a fresh outbox pipe); it reports WorkerReady, or WorkerFailed, like at start-up. Call from the thread
        that started the pool (a worker dies with the thread that made it)."""
        if self._shut_down:
            return
        old = self.inboxes[rank]
        old.cancel_join_thread()
        old.close()
        self.inboxes[rank] = self.ctx.Queue()
        self.processes[rank] = self._process(rank)
        self._start(rank)
        self.generations[rank] += 1

    def start(self, timeout_s: float = 3600.0) -> list[WorkerReady]:
        """Starts every worker and waits until each has loaded its model; raises WorkerStartError otherwise."""
        for rank in range(len(self.processes)):
            self._start(rank)
        ready: dict[int, WorkerReady] = {}
        deadline = time.monotonic() + timeout_s
        while len(ready) < len(self.processes):
            messages, ended = self.receive(1.0)
            for msg in messages:
                if isinstance(msg, WorkerFailed):
                    raise WorkerStartError(f"worker {msg.rank} failed to start: {msg.error}")
                if isinstance(msg, WorkerReady):
                    ready[msg.rank] = msg
                    logger.info("worker %d ready on %s", msg.rank, msg.device)
            if ended:  # a worker's pipe ended before it reported: it is gone
                names = ", ".join(self.processes[rank].name for rank in ended)
                raise WorkerStartError(f"{names} exited during start-up (see its log above)")
            if time.monotonic() > deadline:
                raise WorkerStartError(f"workers not ready after {timeout_s:.0f} s")
        self.ready = [ready[r] for r in range(len(self.processes))]
        return self.ready

    def receive(self, timeout_s: float) -> tuple[list, list[int]]:
        """(messages, ranks whose pipe ended since the last call): what every worker sent, waiting up to timeout_s.
        One thread at a time (start-up, then the front's reader)."""
        for rank, conn in enumerate(self.outboxes):
            old = self._watched.get(rank)
            if old is not conn:  # a restart made a new pipe: the old incarnation's is done
                if old is not None and not old.closed:
                    old.close()
                self._watched[rank] = conn
        open_pipes = {rank: conn for rank, conn in self._watched.items() if not conn.closed}
        if not open_pipes:
            time.sleep(timeout_s)
            return [], []
        return receive(open_pipes, timeout_s)

    def send(self, rank: int, msg) -> None:
        if self._shut_down:  # late aborts of handlers finishing during shutdown: nobody reads them any more
            return
        try:
            self.inboxes[rank].put(msg)
        except ValueError:  # the queue was closed by a restart or the shutdown in between
            pass

    def dead_workers(self) -> list[int]:
        return [rank for rank, p in enumerate(self.processes) if p.pid is not None and not p.is_alive()]

    def kill(self, rank: int, follower_pids: tuple[int, ...] = ()) -> None:
        """Ends replica `rank` at once (a worker that stopped answering): its follower ranks first (a stopped one
        ignores all else), those still children of the worker, then the worker."""
        worker = self.processes[rank]
        for pid in follower_pids:
            if worker.pid is not None and _parent_of(pid) == worker.pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if worker.is_alive():
            worker.kill()

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
        for q in self.inboxes:
            q.cancel_join_thread()  # do not block exit on messages nobody will read
            q.close()
        for conn in self.outboxes:
            if conn is not None and not conn.closed:
                conn.close()


def _parent_of(pid: int) -> int | None:
    """The parent pid of a live process (Linux /proc), None when it is gone or unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
