"""The workers' messages to the front: one pipe per worker, read by the front alone.

No channel is shared: a worker that dies at any point (kill -9, `os._exit` while a message is half written) can only
cut its own pipe short. The front then reads end-of-file on that pipe, which says the worker is gone. (One
`multiprocessing.Queue` shared by every worker has one write lock: a worker that left while its feeder thread held
it blocked every other worker's messages for good.)

Worker side: `WorkerOutbox.put` hands the message to a sender thread (the engine loop never waits on a slow front),
`flush` waits until what was put is in the pipe. Front side: `receive` waits on every pipe at once.
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import queue
import threading
import time

logger = logging.getLogger("lightllm_mtp.server")
MAX_MESSAGES_PER_TURN = 64


class WorkerOutbox:
    """A worker's end of its pipe to the front (pickled into the worker process when it is spawned)."""

    def __init__(self, conn: multiprocessing.connection.Connection):
        self.conn = conn
        self._pending: queue.SimpleQueue | None = None  # made in the worker process, on first use
        self._unsent = 0
        self._broken = False  # the front's end is gone
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"conn": self.conn}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["conn"])

    def put(self, msg) -> None:
        with self._lock:
            if self._pending is None:
                self._pending = queue.SimpleQueue()
                threading.Thread(target=self._send_loop, name="outbox", daemon=True).start()
            self._unsent += 1
        self._pending.put(msg)

    def flush(self, timeout_s: float) -> bool:
        """Waits until every message put is written to the pipe (False: not within timeout_s, e.g. the front is
        gone and the pipe is full)."""
        deadline = time.monotonic() + timeout_s
        while self._unsent and not self._broken and time.monotonic() < deadline:
            time.sleep(0.005)
        return not self._unsent

    def _send_loop(self) -> None:
        while True:
            msg = self._pending.get()
            try:
                self.conn.send(msg)
            except OSError:  # the front is gone: nothing reads this pipe any more
                self._broken = True
                return
            with self._lock:
                self._unsent -= 1


def open_channel(ctx) -> tuple[multiprocessing.connection.Connection, WorkerOutbox]:
    """(the front's read end, the worker's outbox) of a new pipe. The front closes its copy of the write end once the
    worker is started (`close_after_start`), so that the worker's exit is end-of-file on the read end."""
    reader, writer = ctx.Pipe(duplex=False)
    return reader, WorkerOutbox(writer)


def close_after_start(outbox: WorkerOutbox) -> None:
    outbox.conn.close()


def receive(readers: dict[int, multiprocessing.connection.Connection], timeout_s: float) -> tuple[list, list[int]]:
    """(messages, ranks whose pipe ended) from every reader that has something within timeout_s; messages of one
    worker stay in order. A pipe that ended (its worker is gone) is closed here and should not be passed again."""
    ready = multiprocessing.connection.wait(list(readers.values()), timeout_s)
    rank_of = {id(conn): rank for rank, conn in readers.items()}
    messages, ended = [], []
    for conn in ready:
        rank = rank_of[id(conn)]
        try:
            for _ in range(MAX_MESSAGES_PER_TURN):  # what is there, up to a bound: a busy worker cannot starve others
                messages.append(conn.recv())
                if not conn.poll():
                    break
        except (EOFError, OSError):  # the worker exited (or died mid-message): its pipe is done
            conn.close()
            ended.append(rank)
        except Exception:  # a message that does not unpickle: the pipe's framing is intact, skip it
            logger.exception("unreadable message from worker %d", rank)
    return messages, ended
