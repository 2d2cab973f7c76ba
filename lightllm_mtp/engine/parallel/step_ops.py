"""The step description the driver broadcasts to the follower ranks: what its StepRunner is asked to do, in order.

Every rank holds the same runner (its own shard), the same request slots, KV pool and DraftState; applying the same
runner calls in the same order keeps them equal on every rank, and the forwards' collectives line up. The driver
decides (Scheduler, StepBuilder via its runner); followers only replay:
  Launch: the scheduled (request id, new tokens) list, the requests seen for the first time, and which launched
      step is still unread (overlap scheduling);
  Collect: read a launched step back (commits accepted KV slots, frees rejected ones, appends tokens);
  Release: a finished or aborted request returns its slots;
  SaveState: every rank writes its cached state to a file (tests compare stages with a single-process run);
  Stop: the group shuts down.
Ops that need no collective (Collect, Release) wait in the driver and go out with the next Launch or Stop. On the
wire they are JSON (encode_ops / decode_ops): a decode step of B requests is about 10 x B bytes."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from lightllm_mtp.sampling_params import SamplingParams


KEEP_STEPS = 3  # launched steps both sides remember for `after` and Collect (at most two are unread at any time)


@dataclass(frozen=True)
class NewRequest:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    generator_seed: int | None  # the generator every rank builds (sampled requests), None: greedy


@dataclass(frozen=True)
class Launch:
    seq: int  # this launch's number
    after: int | None  # the launch whose results are not read yet (its number), or None
    scheduled: list[tuple[int, int]]  # (request id, new tokens), in the scheduler's order
    new_requests: list[NewRequest]


@dataclass(frozen=True)
class Collect:
    seq: int


@dataclass(frozen=True)
class Release:
    request_id: int


@dataclass(frozen=True)
class SaveState:
    """Every rank writes its cached state (stage_state.py) to `directory`/rank{r}.pt (tests, debugging)."""

    directory: str


@dataclass(frozen=True)
class Stop:
    pass


StepOp = Launch | Collect | Release | SaveState | Stop
_KINDS = {cls.__name__: cls for cls in (Launch, Collect, Release, SaveState, Stop)}


def encode_ops(ops: list[StepOp]) -> bytes:
    """JSON (no pickle between processes): [[kind, fields...], ...]."""
    out = []
    for op in ops:
        if isinstance(op, Launch):
            new = [[r.request_id, r.prompt_ids, _params_fields(r.params), r.generator_seed] for r in op.new_requests]
            out.append(["Launch", op.seq, op.after, op.scheduled, new])
        else:
            out.append([type(op).__name__, *dataclasses.astuple(op)])
    return json.dumps(out, separators=(",", ":")).encode()


def decode_ops(data: bytes) -> list[StepOp]:
    ops: list[StepOp] = []
    for kind, *fields in json.loads(data):
        if kind == "Launch":
            seq, after, scheduled, new = fields
            reqs = [NewRequest(rid, prompt, SamplingParams(**params), seed) for rid, prompt, params, seed in new]
            ops.append(Launch(seq, after, [tuple(s) for s in scheduled], reqs))
        else:
            ops.append(_KINDS[kind](*fields))
    return ops


def _params_fields(params: SamplingParams) -> dict:
    fields = dataclasses.asdict(params)
    fields["stop_token_ids"] = sorted(params.stop_token_ids)
    return fields
