"""What the front knows of each replica's health: dead or restarting (its worker died, or the watchdog ended it), or
silent while it has work: "stalled" past `stall_s` (the router sends new requests elsewhere, /health names it),
overdue past `watchdog_s` (the front declares it dead, fails or reroutes its requests and restarts it).

A busy worker reports at least once a second (model_worker.HEARTBEAT_S) between steps; one step longer than
stall_s (a tp / pp rank that hangs inside a forward, a wedged device) is what makes a replica stalled. Silence counts
from the replica's last message, or from the moment it got work after being idle. Called from the event loop
(`got_work`, the states) and the front's reader thread (the rest); each call reads or writes whole values only.
"""

from __future__ import annotations

import time
from typing import Callable


class ReplicaHealth:
    def __init__(self, num_replicas: int, stall_s: float, watchdog_s: float,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.stall_s, self.watchdog_s = stall_s, watchdog_s
        self.clock = clock
        self.dead: set[int] = set()  # not serving: the worker died or was ended (maybe restarting)
        self.restarting: set[int] = set()
        self.last_heard = [clock()] * num_replicas

    def heard(self, rank: int) -> None:
        self.last_heard[rank] = self.clock()

    def got_work(self, rank: int, outstanding: int) -> None:
        """A request was routed to `rank`, which now has `outstanding` requests: from idle, silence starts now."""
        if outstanding == 1:
            self.heard(rank)

    def silent_s(self, rank: int) -> float:
        return self.clock() - self.last_heard[rank]

    def _silent_past(self, limit_s: float, outstanding: list[int]) -> set[int]:
        return {r for r, n in enumerate(outstanding) if n > 0 and r not in self.dead and self.silent_s(r) > limit_s}

    def stalled(self, outstanding: list[int]) -> set[int]:
        return self._silent_past(self.stall_s, outstanding)

    def overdue(self, outstanding: list[int]) -> list[int]:
        return sorted(self._silent_past(self.watchdog_s, outstanding))

    def states(self, outstanding: list[int]) -> list[str]:
        stalled = self.stalled(outstanding)
        return ["restarting" if r in self.restarting else "dead" if r in self.dead else "stalled" if r in stalled
                else "ok" for r in range(len(outstanding))]  # fmt: skip

    def report(self, outstanding: list[int], draining: bool) -> tuple[int, dict]:
        """/health's (HTTP status, body): 503 while draining or when no replica is "ok", 200 "degraded" when some
        are not, else 200 "ok"."""
        states = self.states(outstanding)
        if draining:
            return 503, {"status": "draining", "replicas": states}
        if "ok" not in states:
            return 503, {"status": "error", "replicas": states}
        if any(s != "ok" for s in states):
            body = {"status": "degraded", "replicas": states, "dead_workers": sorted(self.dead),
                    "stalled_workers": [r for r, s in enumerate(states) if s == "stalled"]}  # fmt: skip
            return 200, body
        return 200, {"status": "ok", "replicas": states}
