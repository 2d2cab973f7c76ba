"""Balances requests over the DP replicas: the one with the fewest outstanding requests, ties in rotation.

Each replica's own scheduler then queues what does not fit its request slots or KV pool, so a request over
capacity waits instead of failing. Called from the event loop (pick) and the output reader thread (done).
"""

from __future__ import annotations

import threading


class Router:
    def __init__(self, num_workers: int):
        self.outstanding = [0] * num_workers
        self._next = 0  # rotation start, so equal loads spread evenly
        self._lock = threading.Lock()

    def pick(self, down: set[int] = frozenset()) -> int | None:
        """The replica for a new request (counted as outstanding until `done`), none of `down`; None: all down."""
        with self._lock:
            n = len(self.outstanding)
            order = [(self._next + i) % n for i in range(n) if (self._next + i) % n not in down]
            if not order:
                return None
            rank = min(order, key=lambda r: self.outstanding[r])
            self.outstanding[rank] += 1
            self._next = (rank + 1) % n
            return rank

    def done(self, rank: int) -> None:
        with self._lock:
            if self.outstanding[rank] <= 0:
                raise RuntimeError(f"router: replica {rank} has no outstanding request to finish")
            self.outstanding[rank] -= 1
