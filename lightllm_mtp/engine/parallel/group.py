"""The tensor / pipeline parallel process group: rank 0 is the calling process (the driver), ranks 1.. are
follower processes started with spawn. Collectives are torch.distributed only: the compute backend (NCCL on
CUDA, gloo on CPU) for the forward's all-reduces, all-gathers and stage-to-stage send / recv with the engine's
`dist_timeout_s`, and a gloo control group that carries the driver's step ops (long timeout: followers wait there
while the engine is idle; a follower whose driver dies exits on its own).

Faults: a rank that dies or stops answering makes the driver's next collective fail (peer gone) or time out
(`dist_timeout_s`); the driver then ends every follower and raises ParallelGroupError naming the ranks."""

from __future__ import annotations

import multiprocessing
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from lightllm_mtp import env
from lightllm_mtp.common.parallel_state import compute_backend, reset_parallel_state
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.engine.parallel.follower import follower_main
from lightllm_mtp.engine.parallel.membership import exchange_status, join_group, leave_group, send_ops
from lightllm_mtp.engine.parallel.step_ops import Stop, StepOp


class ParallelGroupError(RuntimeError):
    """A rank of the tp x pp group died, hung or failed; the whole group has been ended."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ParallelGroup:
    """The driver's handle: starts the followers, sends them step ops, ends them."""

    def __init__(self, args: EngineArgs):
        if dist.is_initialized():
            raise RuntimeError("one tp/pp engine per process: this process already belongs to a process group")
        self.args = args
        self.world_size = args.parallel.world_size
        # NCCL on CUDA, gloo on CPU; LIGHTLLM_MTP_DIST_BACKEND=gloo on CUDA: host-staged, every rank on this GPU
        self.backend, self.host_staged = compute_backend(args.device, env.ENV.dist_backend)
        port = _free_port()
        ctx = multiprocessing.get_context("spawn")
        started = [ctx.Event() for _ in range(1, self.world_size)]
        link = (port, self.backend, self.host_staged)
        self.procs = [
            ctx.Process(target=follower_main, args=(args, rank, link, torch.get_num_threads(), started[rank - 1]),
                        name=f"lightllm_mtp-rank{rank}", daemon=True)
            for rank in range(1, self.world_size)
        ]  # CPU: each rank uses as many intra-op threads as the driver
        for p in self.procs:
            p.start()
        self.error: ParallelGroupError | None = None
        self._wait_started(started)
        try:
            self.control = join_group(args, 0, *link)
        except Exception as e:
            self.fail(e)

    def _wait_started(self, started, timeout_s: float = 300.0) -> None:
        """Until every follower runs its entry point: one that dies before (e.g. a script without a main guard, whose
        spawned copy re-runs it) is named at once instead of after the rendezvous timeout."""
        deadline = time.monotonic() + timeout_s
        while not all(e.is_set() for e in started):
            dead = [(rank, p.exitcode) for rank, p in enumerate(self.procs, start=1) if not p.is_alive()]
            if dead or time.monotonic() > deadline:
                self._kill()
                what = ", ".join(f"rank {r} exited with code {c}" for r, c in dead) or f"not started in {timeout_s} s"
                raise ParallelGroupError(
                    f"follower ranks failed before joining the group ({what}; see their stderr). A script that "
                    'builds a tp / pp LLM needs `if __name__ == "__main__":` (ranks are started with spawn)'
                )
            time.sleep(0.05)

    def check_start(self, status: str) -> None:
        """After every rank built its model: raises (ending the group) unless all of them did."""
        try:
            # ranks load at the same time; allow for skew (a large checkpoint on slower storage) beyond the timeout
            statuses = exchange_status(self.control, status, timeout_s=max(600.0, self.args.dist_timeout_s))
        except Exception as e:
            self.fail(e)
        bad = [f"rank {r}: {s}" for r, s in enumerate(statuses) if s != "ok"]
        if bad:
            self.shutdown(send_stop=False)
            raise ParallelGroupError("the tp/pp group failed to start: " + "; ".join(bad))

    def send(self, ops: list[StepOp]) -> None:
        if self.error is not None:
            raise self.error
        try:
            send_ops(ops, self.control, self.args.dist_timeout_s)
        except Exception as e:
            self.fail(e)

    def barrier(self) -> None:
        try:
            dist.barrier(group=self.control, async_op=True).wait(timeout=timedelta(seconds=self.args.dist_timeout_s))
        except Exception as e:
            self.fail(e)

    def fail(self, cause: BaseException) -> None:
        """Ends every follower and raises the group's error (again on every later call)."""
        if self.error is None:
            states = []
            for p in self.procs:  # a rank that just died may not be reaped yet
                p.join(timeout=1.0 / max(1, len(self.procs)))
            for rank, p in enumerate(self.procs, start=1):
                alive = p.is_alive()
                state = "still running (not answering)" if alive else f"exited with code {p.exitcode}"
                states.append(f"rank {rank} {state}")
            self.error = ParallelGroupError(
                f"tp={self.args.parallel.tp} x pp={self.args.parallel.pp} group ended: a collective failed or "
                f"waited past dist_timeout_s={self.args.dist_timeout_s} s ({type(cause).__name__}: "
                f"{str(cause).splitlines()[0] if str(cause) else ''}); {', '.join(states)}"
            )
            self._kill()
        raise self.error from cause

    def _kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=10)
        # a gloo group whose peers are gone cannot be destroyed cleanly; forget it so a new engine may start
        try:
            leave_group()
        except Exception:
            reset_parallel_state()

    def shutdown(self, send_stop: bool = True) -> None:
        if self.error is not None or not self.procs:
            return
        if send_stop:
            try:
                send_ops([Stop()], self.control, self.args.dist_timeout_s)
            except Exception:
                pass
        for p in self.procs:
            p.join(timeout=30)
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        self.procs = []
        leave_group()
