"""Issue 35 item 1, the cause: the workers' messages to the front travel on one pipe per worker, so a worker that dies
in the middle of writing a message (kill -9, os._exit while its sender thread writes) cuts short only its own pipe:
the front reads end-of-file there and keeps reading every other worker. (One multiprocessing.Queue shared by all
workers has one write lock; a worker that left holding it blocked the other replicas' messages for good.)"""

import os
import time

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.server.args import ServerArgs
from lightllm_mtp.server.messages import WorkerReady, WorkerStats
from lightllm_mtp.server.worker_pool import WorkerPool

BIG = b"x" * (4 << 20)  # far more than a pipe buffers: its writer is mid-message until the front reads


def dies_mid_message(outbox) -> None:
    outbox.put(BIG)  # the sender thread blocks inside this message: nobody reads yet
    time.sleep(0.5)
    os._exit(0)


def talks(outbox, n: int) -> None:
    time.sleep(1.0)  # after the other one died
    for i in range(n):
        outbox.put(i)
    outbox.flush(10.0)


def fake_worker(rank, engine_args, dp, inbox, outbox, log_level) -> None:
    """run_worker's stand-in: reports ready, then rank 0 dies mid-message and rank 1 keeps talking."""
    stats = WorkerStats(rank, 0, 1, 0, 0, 1, 0, 0, 0, 0)
    outbox.put(WorkerReady(rank, "cpu (fake)", 16, 32, (0,), 0, 1, stats))
    outbox.flush(10.0)
    if rank == 0:
        dies_mid_message(outbox)
    talks(outbox, 3)
    inbox.get(timeout=30)  # Shutdown


def collect(read, want: int, timeout_s: float = 30.0) -> tuple[list, set[int]]:
    messages, ended = [], set()
    deadline = time.monotonic() + timeout_s
    while (len(messages) < want or not ended) and time.monotonic() < deadline:
        got, gone = read(0.2)
        messages += got
        ended |= set(gone)
    return messages, ended


def test_a_worker_dying_mid_message_ends_only_its_own_pipe(tiny_dense_dir):
    """WorkerPool with stand-in workers: after start-up rank 0 dies in the middle of a message; rank 1's messages
    still arrive and rank 0's pipe is reported ended (the front closes its copy of each write end once the worker
    started, so a worker's exit is end-of-file)."""
    args = ServerArgs(engine=EngineArgs(model_dir=str(tiny_dense_dir)), model_name="fake", dp=2)
    pool = WorkerPool(args, target=fake_worker)
    try:
        ready = pool.start(timeout_s=60)
        assert [r.rank for r in ready] == [0, 1]
        pool.processes[0].join(30)  # died mid-message
        assert pool.dead_workers() == [0]
        messages, ended = collect(pool.receive, 3)
        assert messages == [0, 1, 2] and ended == {0}
    finally:
        pool.shutdown()
