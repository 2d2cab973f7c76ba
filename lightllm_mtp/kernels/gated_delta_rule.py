"""Gated delta rule (Gated DeltaNet recurrence) with a per-request fp32 state S [nv, dk, dv] (HF layout [K, V]).

Per token and value head, with q, k L2-normalised (fp32, eps 1e-6 inside the rsqrt) and q scaled by dk^-0.5:
    S <- exp(g) * S;  delta = beta * (v - S^T k);  S <- S + k delta^T;  o = S^T q.
GVA: value head h reads query/key head h // (nv // nk)."""

from __future__ import annotations

import functools

import torch

from lightllm_mtp.env import ENV

from lightllm_mtp.kernels._validate import (
    check_device,
    check_dtype,
    check_float,
    check_index,
    check_same_dtype,
    check_shape,
)


def _prepare_qk(q: torch.Tensor, k: torch.Tensor, nv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> fp32 q, k [N, nv, dk]: l2-normalised, q scaled, key heads repeated over their value heads."""
    q = q.float()
    k = k.float()
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * (q.shape[-1] ** -0.5)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    rep = nv // q.shape[1]
    if rep > 1:
        q = q.repeat_interleave(rep, dim=1)
        k = k.repeat_interleave(rep, dim=1)
    return q, k


def _step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """One token for n requests, in place on state [n, nv, dk, dv]; q, k [n, nv, dk], v [n, nv, dv], g, beta
    [n, nv], all fp32 and q/k prepared. Returns o [n, nv, dv] fp32."""
    state.mul_(torch.exp(g)[..., None, None])
    kv_mem = torch.matmul(k.unsqueeze(-2), state).squeeze(-2)  # S^T k: [n, nv, dv]
    delta = beta.unsqueeze(-1) * (v - kv_mem)
    state.add_(k.unsqueeze(-1) * delta.unsqueeze(-2))
    return torch.matmul(q.unsqueeze(-2), state).squeeze(-2)


def gated_delta_rule_prefill_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    b_state_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_has_initial_state: torch.Tensor,
) -> torch.Tensor:
    nv = v.shape[1]
    out = torch.empty_like(v)
    bsz = b_state_idx.shape[0]
    if bsz == 0:
        return out
    qf, kf = _prepare_qk(q, k, nv)
    vf, gf, bf = v.float(), g.float(), beta.float()
    cu = b1_cu_q_len.long()
    lens = cu[1:] - cu[:-1]
    # Longest requests first: the requests still running at step i are then a prefix of the batch, so the
    # state scratch is updated through a view with no per-step gather/scatter.
    order = torch.argsort(lens, descending=True, stable=True)
    starts = cu[:-1][order]
    slots = b_state_idx.long()[order]
    state = ssm_state[slots].float()
    state = torch.where(b_has_initial_state[order][:, None, None, None], state, torch.zeros_like(state))
    sorted_lens = lens[order].tolist()
    live = bsz
    for i in range(sorted_lens[0]):
        while sorted_lens[live - 1] <= i:
            live -= 1
        rows = starts[:live] + i
        o = _step(state[:live], qf[rows], kf[rows], vf[rows], gf[rows], bf[rows])
        out[rows] = o.to(out.dtype)
    ssm_state[slots] = state.to(ssm_state.dtype)
    return out


def gated_delta_rule_decode_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    b_state_idx: torch.Tensor,
) -> torch.Tensor:
    qf, kf = _prepare_qk(q, k, v.shape[1])
    slots = b_state_idx.long()
    state = ssm_state[slots].float()
    o = _step(state, qf, kf, v.float(), g.float(), beta.float())
    ssm_state[slots] = state.to(ssm_state.dtype)
    return o.to(v.dtype)


def _check_common(op, q, k, v, g, beta, ssm_state, b_state_idx) -> None:
    check_shape(op, "q", q, (None, None, None), "[T, nk, dk]")
    check_shape(op, "k", k, tuple(q.shape), "[T, nk, dk] like q")
    check_shape(op, "v", v, (q.shape[0], None, None), "[T, nv, dv]")
    check_float(op, "q", q)
    check_same_dtype(op, "q", q, k=k)
    check_float(op, "v", v)
    nk, nv = q.shape[1], v.shape[1]
    if nk == 0 or nv % nk:
        raise ValueError(f"{op}: v heads nv={nv} must be a multiple of q/k heads nk={nk}")
    check_shape(op, "g", g, (q.shape[0], nv), "[T, nv]")
    check_shape(op, "beta", beta, (q.shape[0], nv), "[T, nv]")
    check_dtype(op, "g", g, (torch.float32,))
    check_dtype(op, "beta", beta, (torch.float32,))
    check_shape(op, "ssm_state", ssm_state, (None, nv, q.shape[2], v.shape[2]), "[S, nv, dk, dv]")
    check_dtype(op, "ssm_state", ssm_state, (torch.float32,))
    check_shape(op, "b_state_idx", b_state_idx, (None,), "[B]")
    check_index(op, "b_state_idx", b_state_idx)


def gated_delta_rule_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    b_state_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_has_initial_state: torch.Tensor,
) -> torch.Tensor:
    """Ragged prefill -> o [T, nv, dv] in v.dtype; writes each request's final state to ssm_state[slot].

    q, k [T, nk, dk] (raw, normalised inside); v [T, nv, dv]; g, beta [T, nv] fp32 (from gdn_gating);
    ssm_state [S, nv, dk, dv] fp32; b_state_idx [B] state rows; b1_cu_q_len [B+1]; b_has_initial_state [B]
    bool (False: start from a zero state, whatever the row holds)."""
    op = "gated_delta_rule_prefill"
    _check_common(op, q, k, v, g, beta, ssm_state, b_state_idx)
    bsz = b_state_idx.shape[0]
    check_shape(op, "b1_cu_q_len", b1_cu_q_len, (bsz + 1,), "[B+1]")
    check_index(op, "b1_cu_q_len", b1_cu_q_len)
    check_shape(op, "b_has_initial_state", b_has_initial_state, (bsz,), "[B]")
    check_dtype(op, "b_has_initial_state", b_has_initial_state, (torch.bool,))
    check_device(
        op, q=q, k=k, v=v, g=g, beta=beta, ssm_state=ssm_state, b_state_idx=b_state_idx, b1_cu_q_len=b1_cu_q_len,
        b_has_initial_state=b_has_initial_state,
    )
    if q.is_cuda and fla_chunk_kernel() is not None:
        return _prefill_fla(q, k, v, g, beta, ssm_state, b_state_idx, b1_cu_q_len, b_has_initial_state)
    return gated_delta_rule_prefill_ref(q, k, v, g, beta, ssm_state, b_state_idx, b1_cu_q_len, b_has_initial_state)


@functools.cache
def fla_chunk_kernel():
    """fla-core's chunked gated-delta-rule kernel (the field's GPU kernel for this prefill), or None."""
    if ENV.force_reference_kernels:
        return None
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule


def _prefill_fla(q, k, v, g, beta, ssm_state, b_state_idx, b1_cu_q_len, b_has_initial_state) -> torch.Tensor:
    """Varlen fla chunk kernel; GVA by repeating key heads (fla wants q/k heads == v heads)."""
    rep = v.shape[1] // q.shape[1]
    if rep > 1:
        q = q.repeat_interleave(rep, dim=1)
        k = k.repeat_interleave(rep, dim=1)
    slots = b_state_idx.long()
    init = torch.where(b_has_initial_state[:, None, None, None], ssm_state[slots], torch.zeros_like(ssm_state[slots]))
    o, final = fla_chunk_kernel()(
        q=q.unsqueeze(0),
        k=k.unsqueeze(0),
        v=v.unsqueeze(0),
        g=g.unsqueeze(0),
        beta=beta.to(v.dtype).unsqueeze(0),
        scale=q.shape[-1] ** -0.5,
        initial_state=init,
        output_final_state=True,
        cu_seqlens=b1_cu_q_len.long(),
        use_qk_l2norm_in_kernel=True,
    )
    ssm_state[slots] = final.float()
    return o.squeeze(0).to(v.dtype)


def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    b_state_idx: torch.Tensor,
) -> torch.Tensor:
    """One token per request -> o [B, nv, dv] in v.dtype; updates ssm_state[b_state_idx] in place.

    q, k [B, nk, dk]; v [B, nv, dv]; g, beta [B, nv] fp32; ssm_state [S, nv, dk, dv] fp32; b_state_idx [B]."""
    op = "gated_delta_rule_decode"
    _check_common(op, q, k, v, g, beta, ssm_state, b_state_idx)
    check_shape(op, "b_state_idx", b_state_idx, (q.shape[0],), "[B] (one row per request)")
    check_device(op, q=q, k=k, v=v, g=g, beta=beta, ssm_state=ssm_state, b_state_idx=b_state_idx)
    return gated_delta_rule_decode_ref(q, k, v, g, beta, ssm_state, b_state_idx)
