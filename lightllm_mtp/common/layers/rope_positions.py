"""The rope inputs of a forward's rows under Qwen3.5's interleaved M-RoPE.

Text rows take one position on all three axes, which is 1-D RoPE at `position + delta`, delta being the request's
rope delta (0 until an image: an image of h x w tokens spans max(h, w) rope positions, so what follows it sits at
its index + delta, delta <= 0). Image rows (an EXTEND forward over a prompt's image tokens) carry their own t / h / w
positions: frequency j rotates by the position of axis `mrope_axis[j]`, so each row gets its own cos / sin row and
the kernels read row r's at index r."""

from __future__ import annotations

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch


def mrope_axis(section: tuple[int, ...], device: torch.device | str | None = None) -> torch.Tensor:
    """[sum(section)] int64: the axis (0 t, 1 h, 2 w) of each frequency; interleaved t, h, w, t, h, w, .. while an
    axis has frequencies of its section left, t after that (HF's interleaved layout)."""
    half = sum(section)
    axis = torch.zeros(half, dtype=torch.int64)
    for a in (1, 2):
        if a < len(section):
            axis[a : 3 * section[a] : 3] = a
    return axis.to(device)


def row_requests(batch: ForwardBatch) -> torch.Tensor:
    """[T] int64 the request slot of each row, on the device without a host sync (padding rows: the last one's)."""
    rows = torch.arange(batch.num_tokens, dtype=batch.b1_cu_q_len.dtype, device=batch.b1_cu_q_len.device)
    b = torch.searchsorted(batch.b1_cu_q_len[1:], rows, right=True).clamp_max(batch.batch_size - 1)
    return batch.b_req_idx.long()[b]


def rope_inputs(batch: ForwardBatch, cos: torch.Tensor, sin: torch.Tensor, rope_delta: torch.Tensor | None,
                axis: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(positions [T], cos, sin) for the rotary kernels: the batch's positions and the model's tables for text-only
    models; with a per-request rope delta (models with a vision tower) positions + delta; with M-RoPE rows, one
    table row per forward row. Made once per forward (ForwardBatch.derived) and shared by the attention layers."""
    if batch.mrope_positions is not None:
        def per_row():  # fmt: skip
            index = batch.mrope_positions[axis].T.contiguous()  # [T, R/2]: row r, frequency j -> position on axis[j]
            return torch.stack([cos.gather(0, index), sin.gather(0, index)])

        tables = batch.derived("mrope_tables", per_row)
        rows = batch.derived("mrope_rows", lambda: torch.arange(batch.num_tokens, device=cos.device))
        return rows, tables[0], tables[1]
    if rope_delta is None:
        return batch.positions, cos, sin
    # clamped: a prefill graph bucket's padding rows (ForwardBatch.padded) are the request's rows too, at stale
    # positions, where its delta would index the tables below 0; real rows past the images never go below 0
    positions = batch.derived("rope_positions",
                              lambda: (batch.positions + rope_delta[row_requests(batch)]).clamp_min(0))  # fmt: skip
    return positions, cos, sin
