"""The conv windows of GDN state snapshots taken inside a prompt forward (prefix cache): for each snapshot, the K-1
pre-conv inputs before its boundary, gathered from the forward's rows or, for a boundary within K-1 rows of a
request's chunk start, from that request's conv history (its conv state before the forward; zeros for a request
without one). One launch per layer instead of a dozen gathers (a warm prefix-cache hit is bound by the host)."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_device, check_dtype, check_index, check_shape
from lightllm_mtp.kernels.triton_utils import triton_available, use_triton

_OP = "snapshot_conv_windows"


def snapshot_conv_windows_ref(x, conv_state, snap_conv, *, conv_index, conv_slots, b_state_idx, b_has_initial_state):
    rows, cols = x.shape[0], snap_conv.shape[2]
    history = conv_state[b_state_idx.to(torch.int64), :, :cols]  # [B, C, K-1]
    history = torch.where(b_has_initial_state[:, None, None], history, torch.zeros_like(history))
    history = history.transpose(1, 2).reshape(-1, x.shape[1])
    in_chunk = (conv_index < rows)[..., None]
    windows = torch.where(in_chunk, x[conv_index.clamp(max=rows - 1)], history[(conv_index - rows).clamp(min=0)])
    snap_conv[conv_slots] = windows.transpose(1, 2).to(snap_conv.dtype)


def snapshot_conv_windows(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    snap_conv: torch.Tensor,
    *,
    conv_index: torch.Tensor,
    conv_slots: torch.Tensor,
    b_state_idx: torch.Tensor,
    b_has_initial_state: torch.Tensor,
) -> None:
    """Writes snap_conv[conv_slots[n], :, j] for every snapshot n and column j < K-1.

    x [T, C] the forward's pre-conv rows (row stride free); conv_state [R, C, W >= K-1] one layer's request conv
    states, columns [0, K-1) the history; snap_conv [S, C, K-1] one layer's snapshot windows; conv_index [N, K-1]
    int64: a row of x when < T, else T + b * (K-1) + column of batch request b's history; conv_slots [N];
    b_state_idx [B] (request slot of each batch request); b_has_initial_state [B] bool."""
    check_shape(_OP, "x", x, (None, None), "[T, C]")
    conv_dim, cols = x.shape[1], snap_conv.shape[2] if snap_conv.ndim == 3 else -1
    check_shape(_OP, "conv_state", conv_state, (None, conv_dim, None), "[R, C, W]")
    check_shape(_OP, "snap_conv", snap_conv, (None, conv_dim, None), "[S, C, K-1]")
    if conv_state.shape[2] < cols:
        raise ValueError(f"{_OP}: conv_state has {conv_state.shape[2]} columns, fewer than the K-1 = {cols} kept")
    check_shape(_OP, "conv_index", conv_index, (None, cols), "[N, K-1]")
    check_shape(_OP, "conv_slots", conv_slots, (conv_index.shape[0],), "[N]")
    check_shape(_OP, "b_has_initial_state", b_has_initial_state, (b_state_idx.shape[0],), "[B]")
    for name, t in (("conv_index", conv_index), ("conv_slots", conv_slots), ("b_state_idx", b_state_idx)):
        check_index(_OP, name, t)
    check_dtype(_OP, "b_has_initial_state", b_has_initial_state, (torch.bool,))
    check_device(_OP, x=x, conv_state=conv_state, snap_conv=snap_conv, conv_index=conv_index, conv_slots=conv_slots,
                 b_state_idx=b_state_idx, b_has_initial_state=b_has_initial_state)  # fmt: skip
    if conv_index.shape[0] == 0:
        return
    if not use_triton(x):
        return snapshot_conv_windows_ref(x, conv_state, snap_conv, conv_index=conv_index, conv_slots=conv_slots,
                                         b_state_idx=b_state_idx, b_has_initial_state=b_has_initial_state)  # fmt: skip
    snapshot_conv_windows_triton(x, conv_state, snap_conv, conv_index, conv_slots, b_state_idx, b_has_initial_state)


def snapshot_conv_windows_triton(x, conv_state, snap_conv, conv_index, conv_slots, b_state_idx, b_has_initial_state):
    conv_dim, cols = x.shape[1], snap_conv.shape[2]
    if x.stride(1) != 1:
        x = x.contiguous()
    block = min(1024, triton.next_power_of_2(conv_dim))
    grid = (conv_index.shape[0], triton.cdiv(conv_dim, block))
    _snapshot_conv_kernel[grid](
        x, conv_state, snap_conv, conv_index, conv_slots, b_state_idx, b_has_initial_state, x.shape[0], conv_dim,
        x.stride(0), *conv_state.stride(), *snap_conv.stride(), COLS=cols, BLOCK=block, num_warps=4,
    )  # fmt: skip


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _snapshot_conv_kernel(
        X, conv_state, snap_conv, conv_index, conv_slots, b_state_idx, b_has_initial_state, rows, conv_dim,
        stride_xt, stride_sr, stride_sc, stride_sw, stride_ns, stride_nc, stride_nw,
        COLS: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        n = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < conv_dim
        dest = snap_conv + tl.load(conv_slots + n).to(tl.int64) * stride_ns + offs * stride_nc
        for j in tl.static_range(COLS):
            idx = tl.load(conv_index + n * COLS + j)
            if idx < rows:
                val = tl.load(X + idx * stride_xt + offs, mask=mask, other=0.0)
            else:
                h = idx - rows
                b = h // COLS
                req = tl.load(b_state_idx + b).to(tl.int64)
                keep = tl.load(b_has_initial_state + b).to(tl.int32) != 0
                val = tl.load(conv_state + req * stride_sr + offs * stride_sc + (h % COLS) * stride_sw,
                              mask=mask, other=0.0)  # fmt: skip
                val = tl.where(keep, val, tl.zeros_like(val))
            tl.store(dest + j * stride_nw, val.to(snap_conv.dtype.element_ty), mask=mask)
