"""Causal conv1d over speculative verify blocks, on a widened conv slot (K-1+mtp_step columns).

Slot layout (per request, per channel): after prefill, columns [0, K-1) hold the last K-1 inputs and the
request's accept length is 1. A verify block of q = 1 + k tokens x_0..x_{q-1} reads its history window at
column offset `accept_len - 1` (the K-1 inputs ending at the last accepted token) and writes back

    slot[0 : K-2+q] = [window[1:], x_0, ..., x_{q-1}]

so that after `a` tokens of this block are accepted the next window starts at column a-1. Worked example,
K=4, k=2: window [h1 h2 h3] -> slot [h2 h3 x0 x1 x2]; accept 1 -> next window [h2 h3 x0] (offset 0),
accept 3 -> [x0 x1 x2] (offset 2). Rollback is an offset, never a copy.

`b_write_col` (optional, per request) moves where the block's columns are written: slot[w : w+K-2+q]. A draft
model's chain steps use it to append one token after the committed window without touching it (read at offset
accept_len - 1 = w - 1, write from w: column w+c takes column w+c, then x). Writes need w <= accept_len.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.kernels.triton_utils import triton_available, use_triton


def causal_conv1d_verify(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    *,
    b_state_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_accept_len: torch.Tensor,
    max_q_len: int | None = None,
    b_write_col: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [T, C]; weight [C, K]; conv_state [S, C, W] with W >= K-2+max q (+ b_write_col); b_state_idx,
    b_accept_len [B]; b1_cu_q_len [B+1]; max_q_len: host bound on block length (None: W-K+2); b_write_col [B]
    first column written (None: 0). Returns silu(conv) [T, C] in x.dtype; updates conv_state in place."""
    if x.ndim != 2 or weight.ndim != 2 or conv_state.ndim != 3:
        raise ValueError("causal_conv1d_verify: x must be [T, C], weight [C, K], conv_state [S, C, W]")
    if weight.shape[0] != x.shape[1] or conv_state.shape[1] != x.shape[1]:
        raise ValueError(f"causal_conv1d_verify: channel mismatch x {tuple(x.shape)}, weight {tuple(weight.shape)}, "
                         f"conv_state {tuple(conv_state.shape)}")
    if b_state_idx.shape != b_accept_len.shape or b1_cu_q_len.shape[0] != b_state_idx.shape[0] + 1:
        raise ValueError("causal_conv1d_verify: b_state_idx, b_accept_len must be [B] and b1_cu_q_len [B+1]")
    if b_write_col is not None and b_write_col.shape != b_state_idx.shape:
        raise ValueError("causal_conv1d_verify: b_write_col must be [B] like b_state_idx")
    if use_triton(x):
        return _verify_triton(x, weight, conv_state, b_state_idx, b1_cu_q_len, b_accept_len, max_q_len, b_write_col)
    return causal_conv1d_verify_ref(x, weight, conv_state, b_state_idx, b1_cu_q_len, b_accept_len, b_write_col)


def _verify_triton(
    x, weight, conv_state, b_state_idx, b1_cu_q_len, b_accept_len, max_q_len, b_write_col
) -> torch.Tensor:
    if max_q_len is None:
        max_q_len = conv_state.shape[2] - weight.shape[1] + 2
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous even when x is a column slice
    channels, kernel = weight.shape
    block_c = 128
    grid = (b_state_idx.shape[0], triton.cdiv(channels, block_c))
    _conv_verify_kernel[grid](
        x, weight, conv_state, b_state_idx, b1_cu_q_len, b_accept_len,
        b_accept_len if b_write_col is None else b_write_col, out, channels,
        x.stride(0), out.stride(0), weight.stride(0), conv_state.stride(0), conv_state.stride(1), conv_state.stride(2),
        K=kernel, MAX_Q=max_q_len, BLOCK_C=block_c, WRITE_COL=b_write_col is not None,
    )
    return out


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _conv_verify_kernel(
        x_ptr, w_ptr, state_ptr, slot_ptr, cu_ptr, acc_ptr, write_ptr, out_ptr, C,
        stride_x, stride_o, stride_w, stride_ss, stride_sc, stride_sw,
        K: tl.constexpr, MAX_Q: tl.constexpr, BLOCK_C: tl.constexpr, WRITE_COL: tl.constexpr,
    ):
        # One program per (request, channel block): the K-1 history columns sit in registers while the block's
        # outputs are produced, then the slot is rewritten as [history[1:], x_0..x_{q-1}].
        b = tl.program_id(0)
        offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask_c = offs_c < C
        slot = tl.load(slot_ptr + b).to(tl.int64)
        start = tl.load(cu_ptr + b)
        q_len = tl.load(cu_ptr + b + 1) - start
        off = tl.load(acc_ptr + b) - 1
        w0 = 0
        if WRITE_COL:
            w0 = tl.load(write_ptr + b)
        row = state_ptr + slot * stride_ss + offs_c * stride_sc
        # window of K inputs ending at the current token: w_j multiplies input t-(K-1)+j
        for i in range(MAX_Q):
            if i < q_len:
                acc = tl.zeros([BLOCK_C], dtype=tl.float32)
                for j in range(K):
                    src = i - (K - 1) + j  # < 0: history column off + K-1 + src
                    if src < 0:
                        val = tl.load(row + (off + K - 1 + src) * stride_sw, mask=mask_c, other=0.0)
                    else:
                        val = tl.load(x_ptr + (start + src) * stride_x + offs_c, mask=mask_c, other=0.0)
                    wj = tl.load(w_ptr + offs_c * stride_w + j, mask=mask_c, other=0.0)
                    acc += val.to(tl.float32) * wj.to(tl.float32)
                y = acc / (1.0 + tl.exp(-acc))
                tl.store(out_ptr + (start + i) * stride_o + offs_c, y.to(out_ptr.dtype.element_ty), mask=mask_c)
        # slot <- [window[1:], x_0..x_{q-1}]: column c takes window[c+1] (c < K-2) or x_{c-(K-2)}.
        # Columns are written in increasing order and column w0+c reads column off+1+c >= w0+c: no overwrite hazard.
        for c in range(K - 2 + MAX_Q):
            if c < K - 2 + q_len:
                if c < K - 2:
                    val = tl.load(row + (off + 1 + c) * stride_sw, mask=mask_c, other=0.0)
                else:
                    val = tl.load(x_ptr + (start + c - (K - 2)) * stride_x + offs_c, mask=mask_c, other=0.0)
                tl.store(row + (w0 + c) * stride_sw, val.to(state_ptr.dtype.element_ty), mask=mask_c)


def causal_conv1d_verify_ref(x, weight, conv_state, b_state_idx, b1_cu_q_len, b_accept_len, b_write_col=None):
    k = weight.shape[1]
    out = torch.empty_like(x)
    w = weight.float()
    cu = b1_cu_q_len.tolist()
    write_cols = [0] * len(cu[1:]) if b_write_col is None else b_write_col.tolist()
    for b, (slot, acc) in enumerate(zip(b_state_idx.tolist(), b_accept_len.tolist())):
        xs = x[cu[b] : cu[b + 1]]
        q, w0 = xs.shape[0], write_cols[b]
        if w0 + k - 2 + q > conv_state.shape[2] or not 0 <= w0 <= acc:
            raise ValueError(f"causal_conv1d_verify: block of {q} tokens written from column {w0} (accept length "
                             f"{acc}) needs {w0 + k - 2 + q} state columns, slot has {conv_state.shape[2]}")
        window = conv_state[slot, :, acc - 1 : acc - 1 + k - 1]  # [C, K-1]
        seq = torch.cat([window.float(), xs.t().float()], dim=1)  # [C, K-1+q]
        y = F.conv1d(seq.unsqueeze(0), w.unsqueeze(1), groups=w.shape[0])[0]  # [C, q]
        out[cu[b] : cu[b + 1]] = F.silu(y).t().to(x.dtype)
        conv_state[slot, :, w0 : w0 + k - 2 + q] = seq[:, 1:].to(conv_state.dtype)
    return out
