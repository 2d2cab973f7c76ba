"""Snapshots of the Gated DeltaNet state (conv window + fp32 SSM state) at token boundaries, for the prefix cache.

A snapshot slot holds, for every GDN layer, the K-1 most recent conv inputs and one SSM state row: what a request
slot holds after prefill (LinearAttState columns [0, K-1), SSM row 0). Prompt chunks fill snapshots inside the GDN
layers (SnapshotPlan: the layer splits a chunk at the boundaries); a finished request's state is copied from its
committed conv window and SSM row (under MTP at offset accept_len - 1: kernels/gdn/*_verify.py); a request that
resumes from a snapshot gets it copied into its own slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightllm_mtp.common.linear_att_state import LinearAttState


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
    """One pass of the GDN recurrence over some requests' consecutive rows; after it, the state rows of `save_b`
    are copied into snapshot slots `save_slots`."""

    rows: torch.Tensor  # [Tp] int64 rows of the forward
    b_index: torch.Tensor  # [Bp] int64 batch requests of the piece
    b1_cu_q_len: torch.Tensor  # [Bp+1] int32
    b_has_initial_state: torch.Tensor  # [Bp] bool
    save_b: torch.Tensor  # [Ns] int64 batch requests whose state is saved after this piece
    save_slots: torch.Tensor  # [Ns] int64
    host_q_lens: tuple[int, ...] = ()  # [Bp] the piece's per-request row counts, on the host (b1_cu_q_len's steps)
    row_span: tuple[int, int] | None = None  # (first, end) when `rows` is one run: slices instead of gathers


@dataclass(frozen=True)
class SnapshotPlan:
    """Snapshots an EXTEND forward fills: the SSM state through `pieces` (each request's chunk split at its
    boundaries), the conv window by gathering K-1 pre-conv inputs per snapshot (`conv_index` into [the forward's
    rows; then K-1 history rows per request, its conv state before the forward])."""

    pieces: list[SnapshotPiece]
    conv_index: torch.Tensor  # [N, K-1] int64
    conv_slots: torch.Tensor  # [N] int64


def build_snapshot_plan(
    chunks: list[tuple[int, int]], has_state: list[bool], cuts: list[list[tuple[int, int]]], conv_cols: int,
    num_rows: int, device: torch.device,
) -> SnapshotPlan | None:  # fmt: skip
    """chunks: per batch request (start position, rows) of its chunk; cuts: per request the (position, snapshot
    slot) of each boundary in (start, start + rows], increasing. None when no snapshot is taken."""
    if not any(cuts):
        return None
    row0 = [0]
    for _, n in chunks:
        row0.append(row0[-1] + n)
    bounds = [[s] + [p for p, _ in c] + ([] if c and c[-1][0] == s + n else [s + n]) for (s, n), c in zip(chunks, cuts)]
    slot_at = [dict(c) for c in cuts]
    pieces = []
    for i in range(max(len(b) - 1 for b in bounds)):
        rows, b_index, cu, init, save_b, save_slots = [], [], [0], [], [], []
        for b, ((s, _), bd) in enumerate(zip(chunks, bounds)):
            if i + 1 >= len(bd):
                continue
            lo, hi = bd[i], bd[i + 1]
            rows += range(row0[b] + lo - s, row0[b] + hi - s)
            b_index.append(b)
            cu.append(cu[-1] + hi - lo)
            init.append(has_state[b] or i > 0)
            if hi in slot_at[b]:
                save_b.append(b)
                save_slots.append(slot_at[b][hi])
        pieces.append(SnapshotPiece(*(torch.tensor(v, dtype=t).to(device, non_blocking=True) for v, t in (
            (rows, torch.int64), (b_index, torch.int64), (cu, torch.int32), (init, torch.bool), (save_b, torch.int64),
            (save_slots, torch.int64))), host_q_lens=tuple(b - a for a, b in zip(cu, cu[1:])),
            row_span=(rows[0], rows[-1] + 1) if rows and rows[-1] - rows[0] == len(rows) - 1 else None))  # fmt: skip
    conv_index, conv_slots = [], []
    for b, ((s, _), c) in enumerate(zip(chunks, cuts)):
        for pos, slot in c:
            conv_index.append([row0[b] + q - s if q >= s else num_rows + b * conv_cols + (q - s + conv_cols)
                               for q in range(pos - conv_cols, pos)])  # fmt: skip
            conv_slots.append(slot)
    return SnapshotPlan(pieces, torch.tensor(conv_index, dtype=torch.int64).to(device, non_blocking=True),
                        torch.tensor(conv_slots, dtype=torch.int64).to(device, non_blocking=True))  # fmt: skip
