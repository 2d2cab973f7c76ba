"""What the HTTP front and the model workers send each other.

front -> worker (one inbox queue per worker): AddRequest (with the prompt's preprocessed images), AbortRequest,
Shutdown.
worker -> front (one outbox pipe per worker, worker_channels.py): WorkerReady / WorkerFailed once at start-up, then
one WorkerOutput per loop iteration that did something (the tokens each request got in that step, plus the worker's
usage), and at least one a second while it has work (a heartbeat, maybe without deltas).
Token ids travel, text does not: detokenization happens in the front, off the model's critical path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lightllm_mtp.multimodal.image_input import ImageInput
from lightllm_mtp.sampling_params import SamplingParams
from lightllm_mtp.spec_decode.stats import SpecStats


@dataclass(frozen=True)
class AddRequest:
    rid: int  # unique across the server
    prompt_ids: list[int]  # each image placeholder expanded to its image's tokens
    params: SamplingParams
    images: tuple[ImageInput, ...] = ()  # the prompt's, in order

    def __reduce__(self):
        """Images travel as numpy arrays: a torch tensor put on a multiprocessing queue would go through torch's
        shared-memory file descriptors, which the inbox's feeder thread has no business holding open."""
        wire = tuple((i.pixel_values.numpy(), i.grid_thw, i.merge_size, i.content_hash) for i in self.images)
        return _add_request, (self.rid, self.prompt_ids, self.params, wire)


def _add_request(rid: int, prompt_ids: list[int], params: SamplingParams, wire: tuple) -> AddRequest:
    images = tuple(ImageInput(torch.from_numpy(values), grid, merge, digest) for values, grid, merge, digest in wire)
    return AddRequest(rid, prompt_ids, params, images)


@dataclass(frozen=True)
class AbortRequest:
    rid: int


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class TokenDelta:
    """The tokens one request got in one worker step; on its last delta, why it ended."""

    rid: int
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None  # with finish_reason "error": what went wrong (the request was rejected or failed)
    spec: SpecStats | None = None  # on the last delta of an MTP request
    num_cached_tokens: int = 0  # on the last delta: prompt tokens served from the prefix cache
    logprobs: list | None = None  # params.logprobs: (logprob, ((id, logprob) top)) per token


@dataclass(frozen=True)
class WorkerStats:
    rank: int
    kv_used: int
    kv_capacity: int
    kv_reserved: int
    req_slots_used: int
    req_slots_capacity: int
    running: int
    waiting: int
    finished_requests: int  # requests this worker ended (any reason), since start
    generated_tokens: int  # since start
    spec: SpecStats = field(default_factory=SpecStats)  # since start, live requests included
    steps: int = 0  # engine steps since start
    step_s: float = 0.0  # seconds inside the engine's steps since start (the rest of the loop: queues, outputs)
    # prefix cache, since start: requests admitted, of which hits, their prompt tokens, those served from the cache
    cache_queries: int = 0
    cache_hits: int = 0
    cache_prompt_tokens: int = 0
    cache_cached_tokens: int = 0
    kv_cached: int = 0  # KV slots owned by the prefix cache now
    cache_snapshots: int = 0  # GDN state snapshot slots in use now, and their number
    cache_snapshot_capacity: int = 0
    cache_host_snapshots: int = 0  # snapshots offloaded to the pinned host tier now; fetched back since start
    cache_host_fetches: int = 0


@dataclass(frozen=True)
class WorkerOutput:
    rank: int
    deltas: list[TokenDelta]
    stats: WorkerStats
    sent_at: float = 0.0  # time.monotonic() at the put (one clock for all processes): the front measures its lag


@dataclass(frozen=True)
class WorkerReady:
    rank: int
    device: str  # e.g. "cuda:1 (NVIDIA H200)" or "cpu (x86_64, 2 threads)"
    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    mtp_step: int  # 0 without MTP
    kv_lookahead_slots: int  # KV slots a request may hold beyond its tokens (Scheduler.kv_need)
    stats: WorkerStats
    follower_pids: tuple[int, ...] = ()  # the replica's other tp / pp ranks (the front's watchdog ends them too)
    image_token_id: int | None = None  # the replica takes images with this placeholder token (None: text only)


@dataclass(frozen=True)
class WorkerFailed:
    rank: int
    error: str  # the exception message (start-up failures: bad checkpoint, MTP layers missing, OOM, ...)
