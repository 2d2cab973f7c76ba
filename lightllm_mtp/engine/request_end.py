"""The end of a request: the one path that gives back everything it holds, the same on the driver and on every tp / pp
follower rank (engine/parallel/follower.py replays the driver's Release with it).

What a request holds, and who gives it back, in this order:
  1. prefix cache (when on): its committed KV slots and a snapshot of its committed GDN state join the tree, its pending
     prompt-end snapshots too, its locks and pins go (PrefixCache.on_finish, from the runner's EndState: plain data
     on where its committed state sits and which queued verify row's KV slot it keeps);
  2. runner: its other KV slots, its open verify blocks, its request slot (with it its GDN state slot, a draft model's
     state slot and its DraftState row);
  3. scheduler (the driver's only): its place in the running or waiting queue, and with it its KV reservation.
Its status (engine/request.py) then becomes FINISHED, or AWAITING_VERIFY when it ended while a verify of it was queued
(overlap) and the prefix cache waits for that verify's first emitted token: the runner hands it over when it collects
the verify, or settles a step the engine drops unread (`verify_arrived`), and the request becomes FINISHED.
"""

from __future__ import annotations

from lightllm_mtp.engine.prefix_cache import PrefixCache
from lightllm_mtp.engine.request import Request, RequestStatus
from lightllm_mtp.engine.scheduler import Scheduler
from lightllm_mtp.engine.step import StepRunner


def end_request(req: Request, runner: StepRunner, cache: PrefixCache | None,
                scheduler: Scheduler | None = None) -> None:  # fmt: skip
    """Releases everything req holds (WAITING or RUNNING; a waiting one holds nothing but its place in the queue)."""
    awaiting = cache is not None and cache.on_finish(req, runner.end_state(req))
    runner.release(req)
    if scheduler is not None:
        scheduler.finish(req)
    req.advance(RequestStatus.AWAITING_VERIFY if awaiting else RequestStatus.FINISHED)


def verify_arrived(req: Request, emitted: list[int], cache: PrefixCache) -> None:
    """AWAITING_VERIFY -> FINISHED: the queued verify's emitted tokens complete the request's end in the cache."""
    cache.after_queued_verify(req, emitted)
    req.advance(RequestStatus.FINISHED)
