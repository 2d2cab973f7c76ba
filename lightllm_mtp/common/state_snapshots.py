"""Snapshots of the Gated DeltaNet state (conv window + fp32 SSM state) at token boundaries, for the prefix cache.

A snapshot slot holds, for every GDN layer, the K-1 most recent conv inputs and one SSM state row: what a request
slot holds after prefill (LinearAttState columns [0, K-1), SSM row 0). Prompt chunks fill snapshots inside the GDN
layers (SnapshotPlan); a finished request's state is copied from its committed conv window and SSM row (under MTP
at offset accept_len - 1: kernels/gdn/*_verify.py); a request that resumes from a snapshot gets it copied into its
own slot. The SSM states at the boundaries come out of the chunk's one prefill call
(kernels/gdn/gated_delta_rule_states.py), split only where a boundary is off the kernel's alignment.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightllm_mtp.common.linear_att_state import LinearAttState
from lightllm_mtp.kernels.gdn.gated_delta_rule_states import StateSaves, make_state_saves
from lightllm_mtp.kernels.triton_utils import to_device_async


class StateSnapshotPool:
    def __init__(self, state: LinearAttState, num_snapshots: int):
        layers, _, conv_dim, width = state.conv.shape
        self.conv_cols = state.conv_cols
        self.rows_per_req = state.rows_per_req
        self.state = state
        self.conv = torch.zeros(layers, num_snapshots, conv_dim, self.conv_cols, dtype=state.conv.dtype,
                                device=state.conv.device)  # fmt: skip
        self.ssm = torch.zeros(layers, num_snapshots, *state.ssm.shape[2:], dtype=torch.float32,
                               device=state.ssm.device)  # fmt: skip

    @property
    def size(self) -> int:
        return self.conv.shape[1]

    @staticmethod
    def bytes_per_snapshot(state: LinearAttState) -> int:
        conv = state.conv[:, 0, :, : state.conv_cols].numel() * state.conv.element_size()
        return conv + state.ssm[:, 0].numel() * 4

    def save(self, snapshot_slot: int, req_idx: int, offset: torch.Tensor | int = 0) -> None:
        """Copies request slot req_idx's committed state (conv columns and SSM row at `offset`, a device scalar under
        MTP: accept_len - 1) into snapshot_slot, on the device, without a host sync."""
        conv, ssm, k1 = self.state.conv, self.state.ssm, self.conv_cols
        if isinstance(offset, int):
            self.conv[:, snapshot_slot] = conv[:, req_idx, :, offset : offset + k1]
            self.ssm[:, snapshot_slot] = ssm[:, req_idx * self.rows_per_req + offset]
            return
        offset = offset.to(torch.int64).reshape(1)
        cols = offset + torch.arange(k1, device=offset.device)
        self.conv[:, snapshot_slot] = conv[:, req_idx].index_select(2, cols)
        self.ssm[:, snapshot_slot] = ssm.index_select(1, offset + req_idx * self.rows_per_req)[:, 0]

    def restore(self, snapshot_slot: int, req_idx: int) -> None:
        """The request's state becomes the snapshot (as after a prefill: conv columns [0, K-1), SSM row 0)."""
        self.state.conv[:, req_idx, :, : self.conv_cols] = self.conv[:, snapshot_slot]
        self.state.ssm[:, req_idx * self.rows_per_req] = self.ssm[:, snapshot_slot]


@dataclass(frozen=True)
class SnapshotPiece:
    """One prefill call of the GDN recurrence over some requests' consecutive rows, saving the states `saves` names
    (destination rows: snapshot slots). rows / b_index None: the whole forward, in order."""

    rows: torch.Tensor | None  # [Tp] int64 rows of the forward
    b_index: torch.Tensor | None  # [Bp] int64 batch requests of the piece (its prefix sums: saves.cu_seqlens)
    b_has_initial_state: torch.Tensor | None  # [Bp] bool (None: the batch's)
    saves: StateSaves


@dataclass(frozen=True)
class SnapshotPlan:
    """Snapshots an EXTEND forward fills: the SSM state through `pieces` (one, unless a boundary falls off the
    kernel's save alignment: the chunk is split there), the conv window by gathering K-1 pre-conv inputs per
    snapshot (`conv_index` into [the forward's rows; then K-1 history rows per request, its conv state before the
    forward])."""

    pieces: list[SnapshotPiece]
    conv_index: torch.Tensor  # [N, K-1] int64
    conv_slots: torch.Tensor  # [N] int64


def _segments(start: int, rows: int, cuts: list[tuple[int, int]], align: int) -> list[tuple[int, int, list]]:
    """A request's chunk as (lo, hi, [(rows consumed, slot)]) segments: cut only at a boundary that is neither a
    multiple of `align` rows from its segment's start nor the chunk's end."""
    segments, lo, saves = [], start, []
    for p, slot in cuts:
        saves.append((p - lo, slot))
        if p != start + rows and (p - lo) % align:
            segments.append((lo, p, saves))
            lo, saves = p, []
    segments.append((lo, start + rows, saves))
    return segments


def build_snapshot_plan(
    chunks: list[tuple[int, int]], has_state: list[bool], cuts: list[list[tuple[int, int]]], conv_cols: int,
    num_rows: int, device: torch.device, align: int = 1,
) -> SnapshotPlan | None:  # fmt: skip
    """chunks: per batch request (start position, rows) of its chunk; cuts: per request the (position, snapshot
    slot) of each boundary in (start, start + rows], increasing; align: state_save_alignment of the device. None
    when no snapshot is taken."""
    if not any(cuts):
        return None
    assert sum(n for _, n in chunks) == num_rows
    row0 = [0]
    for _, n in chunks:
        row0.append(row0[-1] + n)
    segs = [_segments(s, n, c, align) for (s, n), c in zip(chunks, cuts)]
    pieces = []
    if all(len(x) == 1 for x in segs):
        saves = [(b, t, slot) for b, x in enumerate(segs) for t, slot in x[0][2]]
        pieces.append(SnapshotPiece(None, None, None, make_state_saves([n for _, n in chunks], saves, device)))
    for i in range(max(len(x) for x in segs) if not pieces else 0):
        rows, b_index, init, lens, saves = [], [], [], [], []
        for b, ((s, _), x) in enumerate(zip(chunks, segs)):
            if i >= len(x):
                continue
            lo, hi, seg_saves = x[i]
            rows += range(row0[b] + lo - s, row0[b] + hi - s)
            saves += [(len(b_index), t, slot) for t, slot in seg_saves]
            b_index.append(b)
            lens.append(hi - lo)
            init.append(has_state[b] or i > 0)
        pieces.append(SnapshotPiece(*(to_device_async(torch.tensor(v, dtype=t), device) for v, t in (
            (rows, torch.int64), (b_index, torch.int64), (init, torch.bool))),
            make_state_saves(lens, saves, device)))  # fmt: skip
    conv_index, conv_slots = [], []
    for b, ((s, _), c) in enumerate(zip(chunks, cuts)):
        for pos, slot in c:
            conv_index.append([row0[b] + q - s if q >= s else num_rows + b * conv_cols + (q - s + conv_cols)
                               for q in range(pos - conv_cols, pos)])  # fmt: skip
            conv_slots.append(slot)
    return SnapshotPlan(pieces, to_device_async(torch.tensor(conv_index, dtype=torch.int64), device),
                        to_device_async(torch.tensor(conv_slots, dtype=torch.int64), device))  # fmt: skip
