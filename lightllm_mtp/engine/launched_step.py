"""A step whose forward and sampling are queued on the device, and its results on their way to the host.

Overlap scheduling (the engine launches step N+1 before it reads step N's tokens) keeps the GPU busy while the host
does step N's bookkeeping; a LaunchedStep is what the engine holds between a runner's `launch*` and `collect`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from lightllm_mtp.engine.request import Request


class HostCopy:
    """A device tensor copied to pinned host memory without blocking; `tolist()` waits for that copy only."""

    def __init__(self, values: torch.Tensor):
        self.event: torch.cuda.Event | None = None
        if values.is_cuda:
            self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = values

    def tolist(self) -> list:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


@dataclass
class LaunchedStep:
    """reqs: the requests that get tokens from this step, in row order. tokens: [B] sampled tokens on the device
    (the next decode step's input ids) with their host copy; None where the runner produced host results
    directly (`results`) or queued a verify step (`spec`)."""

    reqs: list[Request]
    tokens: torch.Tensor | None = None
    host_tokens: HostCopy | None = None
    results: list[tuple[Request, list[int]]] = field(default_factory=list)
    spec: Any = None  # SpecRunner: the queued verify step (spec_runner.VerifyLaunch)
