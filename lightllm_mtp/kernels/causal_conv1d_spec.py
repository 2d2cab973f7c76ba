"""Causal conv1d over speculative verify blocks, on a widened conv slot (K-1+mtp_step columns).

Slot layout (per request, per channel): after prefill, columns [0, K-1) hold the last K-1 inputs and the
request's accept length is 1. A verify block of q = 1 + k tokens x_0..x_{q-1} reads its history window at
column offset `num_accepted - 1` (the K-1 inputs ending at the last accepted token) and writes back

    slot[0 : K-2+q] = [window[1:], x_0, ..., x_{q-1}]

so that after `a` tokens of this block are accepted the next window starts at column a-1. Worked example,
K=4, k=2: window [h1 h2 h3] -> slot [h2 h3 x0 x1 x2]; accept 1 -> next window [h2 h3 x0] (offset 0),
accept 3 -> [x0 x1 x2] (offset 2). Rollback is an offset, never a copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d_verify(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    b_state_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_num_accepted: torch.Tensor,
) -> torch.Tensor:
    """x [T, C]; weight [C, K]; conv_state [S, C, W] with W >= K-2+max q; b_state_idx, b_num_accepted [B];
    b1_cu_q_len [B+1]. Returns silu(conv) [T, C] in x.dtype; updates conv_state in place."""
    if x.ndim != 2 or weight.ndim != 2 or conv_state.ndim != 3:
        raise ValueError("causal_conv1d_verify: x must be [T, C], weight [C, K], conv_state [S, C, W]")
    if weight.shape[0] != x.shape[1] or conv_state.shape[1] != x.shape[1]:
        raise ValueError(f"causal_conv1d_verify: channel mismatch x {tuple(x.shape)}, weight {tuple(weight.shape)}, "
                         f"conv_state {tuple(conv_state.shape)}")
    if b_state_idx.shape != b_num_accepted.shape or b1_cu_q_len.shape[0] != b_state_idx.shape[0] + 1:
        raise ValueError("causal_conv1d_verify: b_state_idx, b_num_accepted must be [B] and b1_cu_q_len [B+1]")
    return causal_conv1d_verify_ref(x, weight, conv_state, b_state_idx, b1_cu_q_len, b_num_accepted)


def causal_conv1d_verify_ref(x, weight, conv_state, b_state_idx, b1_cu_q_len, b_num_accepted):
    k = weight.shape[1]
    out = torch.empty_like(x)
    w = weight.float()
    cu = b1_cu_q_len.tolist()
    for b, (slot, acc) in enumerate(zip(b_state_idx.tolist(), b_num_accepted.tolist())):
        xs = x[cu[b] : cu[b + 1]]
        q = xs.shape[0]
        if k - 2 + q > conv_state.shape[2]:
            raise ValueError(f"causal_conv1d_verify: block of {q} tokens needs {k - 2 + q} state columns, "
                             f"slot has {conv_state.shape[2]}")
        window = conv_state[slot, :, acc - 1 : acc - 1 + k - 1]  # [C, K-1]
        seq = torch.cat([window.float(), xs.t().float()], dim=1)  # [C, K-1+q]
        y = F.conv1d(seq.unsqueeze(0), w.unsqueeze(1), groups=w.shape[0])[0]  # [C, q]
        out[cu[b] : cu[b + 1]] = F.silu(y).t().to(x.dtype)
        conv_state[slot, :, : k - 2 + q] = seq[:, 1:].to(conv_state.dtype)
    return out
