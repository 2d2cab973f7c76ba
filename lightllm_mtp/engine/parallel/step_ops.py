"""The step description the driver broadcasts to the follower ranks: what its StepRunner is asked to do, in order.

Every rank holds the same runner (its own shard), the same request slots, KV pool and DraftState; applying the same
runner calls in the same order keeps them equal on every rank, and the forwards' collectives line up. The driver
decides (Scheduler, StepBuilder via its runner); followers only replay:
  Launch: the scheduled (request id, new tokens) list, the requests seen for the first time, and which launched
      step is still unread (overlap scheduling);
  Collect: read a launched step back (commits accepted KV slots, frees rejected ones, appends tokens);
  Release: a finished or aborted request ends (engine/request_end.py: its KV and state join the prefix cache's tree,
      its slots go back), with its output length as the driver cut it at a stop;
  Settle: a queued step dropped unread delivers its verify results to the requests awaiting them;
  prefix cache (every rank holds the same tree over its own pools, engine/prefix_cache.py): the calls made outside
      the runner, in the driver's order: Match (introduces a request the followers have not seen) and Unmatch (the
      scheduler's admission), EvictAll; each Launch carries the driver's PrefixCache.digest(), which a follower
      checks before it launches (a rank whose tree diverged fails loudly);
  CompileGrammar: a structured output's grammar starts compiling on the ranks that choose tokens (the last stage's),
      as the driver's does when the request arrives, so that each holds the matcher (over its request mirror's
      output) by the request's first launch (sent at once, ahead of the journal's launch);
  SaveState: every rank writes its cached state to a file (tests compare stages with a single-process run);
  Stop: the group shuts down.
Ops that need no collective (Collect, Release, Settle, the prefix cache's) wait in the driver's StepJournal and go out
with the next Launch or SaveState. On the wire they are JSON (encode_ops / decode_ops): a decode step of B requests is
about 10 x B bytes; a new request's images travel once, as base64 of their fp32 patches (every rank runs its own copy
of the vision tower on them)."""

from __future__ import annotations

import base64
import dataclasses
import json
from dataclasses import dataclass

import torch

from lightllm_mtp.multimodal.image_input import ImageInput
from lightllm_mtp.sampling_params import SamplingParams, StructuredOutput


KEEP_STEPS = 3  # launched steps both sides remember for `after` and Collect (at most two are unread at any time)


@dataclass(frozen=True)
class NewRequest:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    generator_seed: int | None  # the generator every rank builds (sampled requests), None: greedy
    images: tuple[ImageInput, ...] = ()  # the prompt's images: every rank runs its own copy of the vision tower


@dataclass(frozen=True)
class Launch:
    seq: int  # this launch's number
    after: int | None  # the launch whose results are not read yet (its number), or None
    scheduled: list[tuple[int, int]]  # (request id, new tokens), in the scheduler's order
    new_requests: list[NewRequest]
    cache_digest: list[int] | None = None  # PrefixCache.digest() of the driver before this launch (None: no cache)


@dataclass(frozen=True)
class Match:
    request_id: int
    new_request: NewRequest | None  # the request, the first time the followers see it


@dataclass(frozen=True)
class Unmatch:
    request_id: int


@dataclass(frozen=True)
class Settle:
    seq: int


@dataclass(frozen=True)
class EvictAll:
    pass


@dataclass(frozen=True)
class Collect:
    seq: int


@dataclass(frozen=True)
class Release:
    request_id: int
    num_output_tokens: int  # its output as the driver cut it (at a stop token or a length limit)


@dataclass(frozen=True)
class CompileGrammar:
    kind: str  # StructuredOutput's fields
    spec: str
    starts_after: str

    @classmethod
    def of(cls, so: StructuredOutput) -> CompileGrammar:
        return cls(so.kind, so.spec, so.starts_after)

    @property
    def structured(self) -> StructuredOutput:
        return StructuredOutput(self.kind, self.spec, self.starts_after)


@dataclass(frozen=True)
class SaveState:
    """Every rank writes its cached state (stage_state.py) to `directory`/rank{r}.pt (tests, debugging)."""

    directory: str


@dataclass(frozen=True)
class Stop:
    pass


StepOp = Launch | Collect | Release | SaveState | Stop | Match | Unmatch | Settle | EvictAll | CompileGrammar
_KINDS = {cls.__name__: cls for cls in (Launch, Collect, Release, SaveState, Stop, Match, Unmatch, Settle, EvictAll,
                                        CompileGrammar)}


def encode_ops(ops: list[StepOp]) -> bytes:
    """JSON (no pickle between processes): [[kind, fields...], ...]."""
    out = []
    for op in ops:
        if isinstance(op, Launch):
            new = [_new_fields(r) for r in op.new_requests]
            out.append(["Launch", op.seq, op.after, op.scheduled, new, op.cache_digest])
        elif isinstance(op, Match):
            out.append(["Match", op.request_id, _new_fields(op.new_request) if op.new_request else None])
        else:
            out.append([type(op).__name__, *dataclasses.astuple(op)])
    return json.dumps(out, separators=(",", ":")).encode()


def decode_ops(data: bytes) -> list[StepOp]:
    ops: list[StepOp] = []
    for kind, *fields in json.loads(data):
        if kind == "Launch":
            seq, after, scheduled, new, digest = fields
            ops.append(Launch(seq, after, [tuple(s) for s in scheduled], [_new_request(r) for r in new], digest))
        elif kind == "Match":
            rid, new = fields
            ops.append(Match(rid, _new_request(new) if new else None))
        else:
            ops.append(_KINDS[kind](*fields))
    return ops


def _new_fields(r: NewRequest) -> list:
    images = [_image_fields(i) for i in r.images]
    return [r.request_id, r.prompt_ids, _params_fields(r.params), r.generator_seed, images]


def _new_request(fields: list) -> NewRequest:
    rid, prompt, params, seed, images = fields
    if params["structured"] is not None:
        params["structured"] = StructuredOutput(**params["structured"])
    return NewRequest(rid, prompt, SamplingParams(**params), seed, tuple(_image(i) for i in images))


def _image_fields(image: ImageInput) -> list:
    """An image's patches as base64 of their fp32 bytes (exact), with its grid, merge size and content hash."""
    raw = base64.b64encode(image.pixel_values.numpy().tobytes()).decode()
    return [list(image.grid_thw), image.merge_size, image.content_hash, list(image.pixel_values.shape), raw]


def _image(fields: list) -> ImageInput:
    grid, merge, digest, shape, raw = fields
    values = torch.frombuffer(bytearray(base64.b64decode(raw)), dtype=torch.float32).view(*shape)
    return ImageInput(values, tuple(grid), merge, digest)


def _params_fields(params: SamplingParams) -> dict:
    fields = dataclasses.asdict(params)
    fields["stop_token_ids"] = sorted(params.stop_token_ids)
    return fields
