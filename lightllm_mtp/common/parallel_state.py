"""This process's tensor / pipeline parallel groups and the collectives the model forward needs.

Set once per process (`init_parallel_state`, engine/parallel/); with tp = pp = 1 nothing is set and every
collective is the identity, so single-process code paths are unchanged. Groups: `tp` (the ranks of one stage),
`pp` (one rank per stage, same tp rank), all on the compute backend (NCCL on CUDA, gloo on CPU).

gloo on CUDA (env LIGHTLLM_MTP_DIST_BACKEND=gloo: tp / pp tests on one GPU): gloo's send / recv / all-gather take
host tensors only, so every collective here stages its tensors through host memory (`host_staged`); that syncs the
device, so it cannot run inside a CUDA graph (graphs under pp keep send / recv outside them)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from lightllm_mtp.config.parallel_config import ParallelConfig, RankInfo


@dataclass
class ParallelState:
    info: RankInfo
    tp_group: object | None = None
    pp_group: object | None = None
    pp_ranks: tuple[int, ...] = (0,)  # global ranks of this process's pp group, stage order
    host_staged: bool = False  # collectives copy their tensors to host memory and back (gloo on CUDA)

    @property
    def tp_size(self) -> int:
        return self.info.parallel.tp

    @property
    def tp_rank(self) -> int:
        return self.info.tp_rank

    @property
    def pp_size(self) -> int:
        return self.info.parallel.pp


_STATE = ParallelState(RankInfo(ParallelConfig()))


def state() -> ParallelState:
    return _STATE


def compute_backend(device: torch.device, choice: str = "auto") -> tuple[str, bool]:
    """(torch.distributed backend, host_staged) of the forwards' collectives for `device` and the env's choice
    ("auto", "nccl", "gloo"); ValueError for NCCL without CUDA."""
    if choice == "auto":
        choice = "nccl" if device.type == "cuda" else "gloo"
    if choice == "nccl" and device.type != "cuda":
        raise ValueError(f"dist backend nccl needs a CUDA device, got {device}")
    if choice not in ("nccl", "gloo"):
        raise ValueError(f"dist backend must be 'auto', 'nccl' or 'gloo', got {choice!r}")
    return choice, choice == "gloo" and device.type == "cuda"


def init_parallel_state(info: RankInfo, host_staged: bool = False, timeout_s: float | None = None) -> ParallelState:
    """Creates the tp and pp groups (every rank calls this with its own info, after init_process_group). timeout_s:
    how long one of the forward's collectives may wait for a peer before it raises (the engine's dist_timeout_s;
    None: torch's default for the backend, 30 min on gloo)."""
    global _STATE
    tp, pp = info.parallel.tp, info.parallel.pp
    new = ParallelState(info, host_staged=host_staged)
    timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
    for stage in range(pp):  # new_group is collective: every rank creates every group
        ranks = list(range(stage * tp, (stage + 1) * tp))
        group = dist.new_group(ranks, timeout=timeout) if tp > 1 else None
        if stage == info.stage:
            new.tp_group = group
    for tp_rank in range(tp):
        ranks = [stage * tp + tp_rank for stage in range(pp)]
        group = dist.new_group(ranks, timeout=timeout) if pp > 1 else None
        if tp_rank == info.tp_rank:
            new.pp_group, new.pp_ranks = group, tuple(ranks)
    _STATE = new
    return new


def check_layout(info: RankInfo) -> None:
    """Raises unless a model of rank `info` may run its collectives in this process: the parallel state is
    process-wide, so a one-process engine built beside a live tp / pp group (or a model of another layout) would
    call that group's collectives and wait for ranks that never join them."""
    live = _STATE.info
    if live.parallel.world_size > 1 and live != info:
        raise RuntimeError(
            f"this process holds a live tp={live.parallel.tp} x pp={live.parallel.pp} group (rank {live.rank}) and "
            f"the parallel state is per process: an engine of tp={info.parallel.tp} x pp={info.parallel.pp} "
            f"(rank {info.rank}) cannot run beside it. Shut the other engine down first (LLM.shutdown()) or build "
            "this one in another process"
        )


def reset_parallel_state() -> None:
    global _STATE
    _STATE = ParallelState(RankInfo(ParallelConfig()))


def _wire(x: torch.Tensor) -> torch.Tensor:
    """The tensor a collective works on: x itself, or a host copy of it when collectives are host-staged (a copy
    even of a host tensor, so that CPU tests exercise the copy back)."""
    return x.to("cpu", copy=True) if _STATE.host_staged else x.contiguous()


def _in_place(op, x: torch.Tensor) -> torch.Tensor:
    """Runs an in-place collective `op(tensor)` on x (through a host copy when staged) and returns x."""
    wire = _wire(x)
    op(wire)
    if wire is not x:
        x.copy_(wire)
    return x


def _all_gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    wire = _wire(x)
    parts = [torch.empty_like(wire) for _ in range(_STATE.tp_size)]
    dist.all_gather(parts, wire, group=_STATE.tp_group)
    return torch.cat(parts, dim=dim).to(x.device)


# ---- tensor parallel ---------------------------------------------------------------------------------
def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sums the partial outputs of a row-parallel layer over the tp ranks (in place)."""
    if _STATE.tp_size > 1:
        _in_place(lambda t: dist.all_reduce(t, group=_STATE.tp_group), x)
    return x


def tp_all_gather_last(x: torch.Tensor) -> torch.Tensor:
    """Concatenates each tp rank's slice of the last dimension (vocab-parallel logits)."""
    if _STATE.tp_size == 1:
        return x
    return _all_gather(x, dim=-1)


def tp_all_gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Concatenates each tp rank's rows (dim 0): a whole vocab-parallel matrix, for a one-time copy at start."""
    if _STATE.tp_size == 1:
        return x
    return _all_gather(x, dim=0)


# ---- pipeline parallel -------------------------------------------------------------------------------
def pp_send_next(tensors: list[torch.Tensor]) -> None:
    """Hands activations to the next stage (same tp rank)."""
    dst = _STATE.pp_ranks[_STATE.info.stage + 1]
    for t in tensors:
        dist.send(_wire(t), dst, group=_STATE.pp_group)


def pp_recv_into(tensors: list[torch.Tensor]) -> None:
    """Fills `tensors` (contiguous: e.g. the static input buffers of a stage's CUDA graph) with the previous
    stage's activations, sent by pp_send_next in the same order."""
    src = _STATE.pp_ranks[_STATE.info.stage - 1]
    for t in tensors:
        _in_place(lambda wire: dist.recv(wire, src, group=_STATE.pp_group), t)


def pp_recv_prev(shapes: list[tuple[int, ...]], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    out = [torch.empty(shape, dtype=dtype, device=device) for shape in shapes]
    pp_recv_into(out)
    return out


def pp_broadcast_from_last(x: torch.Tensor) -> torch.Tensor:
    """The last stage's tensor on every stage (in place; other stages pass a buffer of the same shape and dtype):
    sampled tokens, accept lengths, emitted tokens and drafts, so that no stage builds its next step from state
    the last stage has not confirmed."""
    if _STATE.pp_size > 1:
        _in_place(lambda t: dist.broadcast(t, _STATE.pp_ranks[-1], group=_STATE.pp_group), x)
    return x
