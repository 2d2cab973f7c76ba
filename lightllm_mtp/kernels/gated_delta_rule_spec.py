"""Gated delta rule over speculative verify blocks with per-position SSM state rows.

Each request owns `rows_per_req = 1 + mtp_step` consecutive fp32 state rows starting at `b_state_base`.
The committed state is row `num_accepted - 1` (row 0 after prefill). A verify block of q tokens starts from
that row and writes the state after token i into row i, so accepting a tokens leaves the committed state in
row a-1: rollback is an index, not a copy.
"""

from __future__ import annotations

import torch

from lightllm_mtp.kernels.gated_delta_rule import gated_delta_rule_decode_ref


def gated_delta_rule_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    b_state_base: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_num_accepted: torch.Tensor,
) -> torch.Tensor:
    """q, k [T, nk, dk]; v [T, nv, dv]; g, beta [T, nv] fp32; ssm_state [R, nv, dk, dv] fp32;
    b_state_base, b_num_accepted [B]; b1_cu_q_len [B+1]. Returns o [T, nv, dv] in v.dtype."""
    if q.shape != k.shape or q.ndim != 3 or v.ndim != 3 or q.shape[0] != v.shape[0]:
        raise ValueError(f"gated_delta_rule_verify: bad q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if g.shape != v.shape[:2] or beta.shape != v.shape[:2]:
        raise ValueError("gated_delta_rule_verify: g and beta must be [T, nv]")
    if ssm_state.dtype != torch.float32 or ssm_state.shape[1:] != (v.shape[1], q.shape[2], v.shape[2]):
        raise ValueError(f"gated_delta_rule_verify: ssm_state must be fp32 [R, nv, dk, dv], got "
                         f"{ssm_state.dtype} {tuple(ssm_state.shape)}")
    if b_state_base.shape != b_num_accepted.shape or b1_cu_q_len.shape[0] != b_state_base.shape[0] + 1:
        raise ValueError("gated_delta_rule_verify: b_state_base, b_num_accepted must be [B], b1_cu_q_len [B+1]")
    return gated_delta_rule_verify_ref(q, k, v, g, beta, ssm_state, b_state_base, b1_cu_q_len, b_num_accepted)


def gated_delta_rule_verify_ref(q, k, v, g, beta, ssm_state, b_state_base, b1_cu_q_len, b_num_accepted):
    out = torch.empty_like(v)
    cu = b1_cu_q_len.tolist()
    max_q = max(b - a for a, b in zip(cu, cu[1:]))
    base = b_state_base.long()
    read_rows = base + b_num_accepted.long() - 1
    scratch = ssm_state[read_rows].clone()  # [B, nv, dk, dv]; read before any row is overwritten
    scratch_idx = torch.arange(len(base), dtype=torch.int32, device=q.device)
    for i in range(max_q):  # token i of every block that has one
        live = [b for b in range(len(base)) if cu[b] + i < cu[b + 1]]
        rows = torch.tensor([cu[b] + i for b in live], device=q.device)
        sel = torch.tensor(live, device=q.device)
        state = scratch[sel]
        o = gated_delta_rule_decode_ref(q[rows], k[rows], v[rows], g[rows], beta[rows], state, scratch_idx[: len(live)])
        out[rows] = o
        scratch[sel] = state
        ssm_state[base[sel] + i] = state
    return out
