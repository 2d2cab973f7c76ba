"""This process's tensor / pipeline parallel groups and the collectives the model forward needs.

Set once per process (`init_parallel_state`, engine/parallel/); with tp = pp = 1 nothing is set and every
collective is the identity, so single-process code paths are unchanged. Groups: `tp` (the ranks of one stage),
`pp` (one rank per stage, same tp rank), all on the compute backend (NCCL on CUDA, gloo on CPU)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from lightllm_mtp.config.parallel_config import ParallelConfig, RankInfo


@dataclass
class ParallelState:
    info: RankInfo
    tp_group: object | None = None
    pp_group: object | None = None
    pp_ranks: tuple[int, ...] = (0,)  # global ranks of this process's pp group, stage order

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


def init_parallel_state(info: RankInfo) -> ParallelState:
    """Creates the tp and pp groups (every rank calls this with its own info, after init_process_group)."""
    global _STATE
    tp, pp = info.parallel.tp, info.parallel.pp
    new = ParallelState(info)
    for stage in range(pp):  # new_group is collective: every rank creates every group
        ranks = list(range(stage * tp, (stage + 1) * tp))
        group = dist.new_group(ranks) if tp > 1 else None
        if stage == info.stage:
            new.tp_group = group
    for tp_rank in range(tp):
        ranks = [stage * tp + tp_rank for stage in range(pp)]
        group = dist.new_group(ranks) if pp > 1 else None
        if tp_rank == info.tp_rank:
            new.pp_group, new.pp_ranks = group, tuple(ranks)
    _STATE = new
    return new


def reset_parallel_state() -> None:
    global _STATE
    _STATE = ParallelState(RankInfo(ParallelConfig()))


# ---- tensor parallel ---------------------------------------------------------------------------------
def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sums the partial outputs of a row-parallel layer over the tp ranks (in place)."""
    if _STATE.tp_size > 1:
        dist.all_reduce(x, group=_STATE.tp_group)
    return x


def tp_all_gather_last(x: torch.Tensor) -> torch.Tensor:
    """Concatenates each tp rank's slice of the last dimension (vocab-parallel logits)."""
    if _STATE.tp_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_STATE.tp_size)]
    dist.all_gather(parts, x.contiguous(), group=_STATE.tp_group)
    return torch.cat(parts, dim=-1)


def tp_all_gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Concatenates each tp rank's rows (dim 0): a whole vocab-parallel matrix, for a one-time copy at start."""
    if _STATE.tp_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_STATE.tp_size)]
    dist.all_gather(parts, x.contiguous(), group=_STATE.tp_group)
    return torch.cat(parts, dim=0)


# ---- pipeline parallel -------------------------------------------------------------------------------
def pp_send_next(tensors: list[torch.Tensor]) -> None:
    """Hands activations to the next stage (same tp rank)."""
    dst = _STATE.pp_ranks[_STATE.info.stage + 1]
    for t in tensors:
        dist.send(t.contiguous(), dst, group=_STATE.pp_group)


def pp_recv_prev(shapes: list[tuple[int, ...]], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    src = _STATE.pp_ranks[_STATE.info.stage - 1]
    out = []
    for shape in shapes:
        t = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(t, src, group=_STATE.pp_group)
        out.append(t)
    return out


def pp_broadcast_from_last(x: torch.Tensor) -> torch.Tensor:
    """The last stage's tensor on every stage (in place; other stages pass a buffer of the same shape and dtype):
    sampled tokens, accept lengths, emitted tokens and drafts, so that no stage builds its next step from state
    the last stage has not confirmed."""
    if _STATE.pp_size > 1:
        dist.broadcast(x, _STATE.pp_ranks[-1], group=_STATE.pp_group)
    return x
