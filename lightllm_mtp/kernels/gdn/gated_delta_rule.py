"""Gated delta rule (Gated DeltaNet recurrence) with a per-request fp32 state S [nv, dk, dv] (HF layout [K, V]).

Per token and value head, with q, k L2-normalised (fp32, eps 1e-6 inside the rsqrt) and q scaled by dk^-0.5:
    S <- exp(g) * S;  delta = beta * (v - S^T k);  S <- S + k delta^T;  o = S^T q.
GVA: value head h reads query/key head h // (nv // nk).

Decode on GPU runs Triton kernels: `gated_delta_rule_decode` one program per (request, value head, V tile) holding
its [dk, V-tile] state slice in registers; `gated_delta_rule_decode_fused` (the whole GDN decode step from the raw
in_proj output: conv update + SiLU, gates, q/k l2norm, recurrence) adds the conv kernel in front of it."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import (
    check_device,
    check_dtype,
    check_float,
    check_index,
    check_same_dtype,
    check_shape,
)
from lightllm_mtp.kernels.gdn.causal_conv1d import causal_conv1d_update_ref, causal_conv1d_update_triton
from lightllm_mtp.kernels.gdn.fla_prefill import PrefillChunks, fla_chunk_kernel, prefill_fla
from lightllm_mtp.kernels.gdn.gdn_gating import gdn_gating_ref
from lightllm_mtp.kernels.pdl import pdl_args
from lightllm_mtp.kernels.triton_utils import next_pow2, num_sms, triton_available, use_triton


def _prepare_qk(
    q: torch.Tensor, k: torch.Tensor, nv: int, normalized: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> fp32 q, k [N, nv, dk]: l2-normalised (unless already), q scaled, key heads repeated over their value
    heads."""
    q = q.float()
    k = k.float()
    if not normalized:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * (q.shape[-1] ** -0.5)
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
    qk_normalized: bool = False,
    saves: list[tuple[int, int, int]] | None = None,
    states_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """saves: (request, rows consumed, row d): the state after that many of the request's rows -> states_out[d]."""
    nv = v.shape[1]
    out = torch.empty_like(v)
    bsz = b_state_idx.shape[0]
    if bsz == 0:
        return out
    qf, kf = _prepare_qk(q, k, nv, qk_normalized)
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
    at_step: dict[int, list[tuple[int, int]]] = {}
    if saves:
        position = {b: j for j, b in enumerate(order.tolist())}
        for b, t, dest in saves:
            at_step.setdefault(t - 1, []).append((position[b], dest))
    live = bsz
    for i in range(sorted_lens[0]):
        while sorted_lens[live - 1] <= i:
            live -= 1
        rows = starts[:live] + i
        o = _step(state[:live], qf[rows], kf[rows], vf[rows], gf[rows], bf[rows])
        out[rows] = o.to(out.dtype)
        for j, dest in at_step.get(i, ()):
            states_out[dest] = state[j]
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
    *,
    b_state_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_has_initial_state: torch.Tensor,
    qk_normalized: bool = False,
    chunks: PrefillChunks | None = None,
) -> torch.Tensor:
    """Ragged prefill -> o [T, nv, dv] in v.dtype; writes each request's final state to ssm_state[slot].

    q, k [T, nk, dk] (raw, normalised inside; qk_normalized: already L2-normalised, e.g. by
    causal_conv1d_prefill_qkv); v [T, nv, dv]; g, beta [T, nv] fp32 (from gdn_gating); ssm_state [S, nv, dk, dv]
    fp32; b_state_idx [B] state rows; b1_cu_q_len [B+1]; b_has_initial_state [B] bool (False: start from a zero
    state, whatever the row holds). chunks: this batch's PrefillChunks (prefill_chunks), shared by the layers of
    one forward; None: the GPU kernel derives them, with a host sync."""
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
    if chunks is not None and chunks.cu_seqlens.shape != b1_cu_q_len.shape:
        raise ValueError(f"{op}: chunks were made for {chunks.cu_seqlens.shape[0] - 1} requests, the batch has {bsz}")
    if q.is_cuda and fla_chunk_kernel() is not None:
        return prefill_fla(q, k, v, g, beta, ssm_state, b_state_idx, b1_cu_q_len, b_has_initial_state, qk_normalized,
                           chunks)  # fmt: skip
    return gated_delta_rule_prefill_ref(
        q, k, v, g, beta, ssm_state, b_state_idx, b1_cu_q_len, b_has_initial_state, qk_normalized
    )


def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    *,
    b_state_idx: torch.Tensor,
) -> torch.Tensor:
    """One token per request -> o [B, nv, dv] in v.dtype; updates ssm_state[b_state_idx] in place.

    q, k [B, nk, dk]; v [B, nv, dv]; g, beta [B, nv] fp32; ssm_state [S, nv, dk, dv] fp32; b_state_idx [B]."""
    op = "gated_delta_rule_decode"
    _check_common(op, q, k, v, g, beta, ssm_state, b_state_idx)
    check_shape(op, "b_state_idx", b_state_idx, (q.shape[0],), "[B] (one row per request)")
    check_device(op, q=q, k=k, v=v, g=g, beta=beta, ssm_state=ssm_state, b_state_idx=b_state_idx)
    if use_triton(q):
        return gated_delta_rule_decode_triton(q, k, v, g, beta, ssm_state, b_state_idx)
    return gated_delta_rule_decode_ref(q, k, v, g, beta, ssm_state, b_state_idx)


def gated_delta_rule_decode_fused_ref(
    qkv: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    b_conv_idx: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_state: torch.Tensor,
    b_ssm_idx: torch.Tensor,
    nk: int,
    dk: int,
    dv: int,
) -> torch.Tensor:
    bsz, nv = a.shape
    x = causal_conv1d_update_ref(qkv, conv_weight, conv_state, b_conv_idx)
    q, k, v = x.split([nk * dk, nk * dk, nv * dv], dim=-1)
    g, beta = gdn_gating_ref(a, b, A_log, dt_bias)
    return gated_delta_rule_decode_ref(
        q.reshape(bsz, nk, dk), k.reshape(bsz, nk, dk), v.reshape(bsz, nv, dv), g, beta, ssm_state, b_ssm_idx
    )


def gated_delta_rule_decode_fused(
    qkv: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    ssm_state: torch.Tensor,
    *,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    b_conv_idx: torch.Tensor,
    b_ssm_idx: torch.Tensor,
    nk: int,
    dk: int,
    dv: int,
) -> torch.Tensor:
    """The whole Gated DeltaNet decode step of one token per request -> o [B, nv, dv] in qkv.dtype.

    qkv [B, conv_dim = 2*nk*dk + nv*dv]: the raw q|k|v in_proj output (before the conv; rows may be strided);
    conv_weight [conv_dim, K]; conv_state [S, conv_dim, W >= K-1]; b_conv_idx [B] conv state slots;
    a, b [B, nv] raw gate projections; A_log, dt_bias [nv]; ssm_state [S2, nv, dk, dv] fp32; b_ssm_idx [B]
    state rows. Equals causal_conv1d_update -> split q|k|v -> gdn_gating -> gated_delta_rule_decode: both
    states are updated in place, conv_state in columns [0, K-1) only."""
    op = "gated_delta_rule_decode_fused"
    check_shape(op, "qkv", qkv, (None, None), "[B, conv_dim]")
    check_float(op, "qkv", qkv)
    bsz, conv_dim = qkv.shape
    check_shape(op, "a", a, (bsz, None), "[B, nv]")
    nv = a.shape[1]
    check_shape(op, "b", b, (bsz, nv), "[B, nv]")
    check_float(op, "a", a)
    check_same_dtype(op, "a", a, b=b)
    if nk <= 0 or dk <= 0 or dv <= 0 or nv % nk:
        raise ValueError(f"{op}: need nk, dk, dv > 0 and nv={nv} a multiple of nk={nk}; got nk={nk} dk={dk} dv={dv}")
    if conv_dim != 2 * nk * dk + nv * dv:
        raise ValueError(f"{op}: qkv width {conv_dim} != 2*nk*dk + nv*dv = {2 * nk * dk + nv * dv}")
    check_shape(op, "conv_weight", conv_weight, (conv_dim, None), "[conv_dim, K]")
    check_float(op, "conv_weight", conv_weight)
    if conv_weight.shape[1] < 1:
        raise ValueError(f"{op}: conv kernel size K must be >= 1, got shape {list(conv_weight.shape)}")
    check_shape(op, "conv_state", conv_state, (None, conv_dim, None), "[S, conv_dim, W]")
    check_float(op, "conv_state", conv_state)
    if conv_state.shape[2] < conv_weight.shape[1] - 1:
        raise ValueError(f"{op}: conv_state width W={conv_state.shape[2]} < K-1={conv_weight.shape[1] - 1}")
    check_shape(op, "A_log", A_log, (nv,), "[nv]")
    check_shape(op, "dt_bias", dt_bias, (nv,), "[nv]")
    check_float(op, "A_log", A_log)
    check_float(op, "dt_bias", dt_bias)
    check_shape(op, "ssm_state", ssm_state, (None, nv, dk, dv), "[S2, nv, dk, dv]")
    check_dtype(op, "ssm_state", ssm_state, (torch.float32,))
    check_shape(op, "b_conv_idx", b_conv_idx, (bsz,), "[B]")
    check_index(op, "b_conv_idx", b_conv_idx)
    check_shape(op, "b_ssm_idx", b_ssm_idx, (bsz,), "[B]")
    check_index(op, "b_ssm_idx", b_ssm_idx)
    check_device(
        op, qkv=qkv, conv_weight=conv_weight, conv_state=conv_state, b_conv_idx=b_conv_idx, a=a, b=b, A_log=A_log,
        dt_bias=dt_bias, ssm_state=ssm_state, b_ssm_idx=b_ssm_idx,
    )
    if use_triton(qkv):
        return gated_delta_rule_decode_fused_triton(
            qkv, conv_weight, conv_state, b_conv_idx, a, b, A_log, dt_bias, ssm_state, b_ssm_idx, nk, dk, dv
        )
    return gated_delta_rule_decode_fused_ref(
        qkv, conv_weight, conv_state, b_conv_idx, a, b, A_log, dt_bias, ssm_state, b_ssm_idx, nk, dk, dv
    )


def _heads_view(x: torch.Tensor) -> torch.Tensor:
    """[B, H, D] with a unit last stride (the kernels address rows and heads through their strides)."""
    return x if x.stride(2) == 1 or x.shape[2] == 1 else x.contiguous()


def decode_block_v(batch: int, v_heads: int, dv: int, sms: int) -> int:
    """The decode kernel's V tile (programs: batch x v_heads x dv / tile). Tiles of 32 give small batches enough
    programs; from ~16 programs per SM on, tiles of 64 stream the state faster (H200, 48 heads of 128 x 128: batch 8
    ran 10.2 us with 32 vs 11.2 with 64, batch 32 57 us with 64 vs 62 with 32); under ~2 programs per SM, tiles of 16
    (H100, 32 heads at batch 1: 3.69 us with 16 vs 4.19 with 32)."""
    programs_at_32 = batch * v_heads * -(-dv // 32)
    tile = 16 if programs_at_32 < 2 * sms else (32 if programs_at_32 < 16 * sms else 64)
    return min(next_pow2(dv), tile)


def _launch_decode(q, k, v, g_or_a, beta_or_b, A_log, dt_bias, ssm_state, b_state_idx, fused_gates, block_v):
    """q, k [B, nk, dk], v [B, nv, dv] views; gates [B, nv] (fp32 g / beta, or raw a / b when fused_gates)."""
    bsz, nv, dv = v.shape
    nk, dk = q.shape[1], q.shape[2]
    o = torch.empty(bsz, nv, dv, dtype=v.dtype, device=v.device)
    if o.numel() == 0:
        return o
    q, k, v = _heads_view(q), _heads_view(k), _heads_view(v)
    g_or_a = g_or_a if g_or_a.stride(1) == 1 else g_or_a.contiguous()
    beta_or_b = beta_or_b if beta_or_b.stride(1) == 1 else beta_or_b.contiguous()
    block_k = triton.next_power_of_2(dk)
    if block_v is None:
        block_v = decode_block_v(bsz, nv, dv, num_sms(v.device))
    _gdr_decode_kernel[(bsz, nv, triton.cdiv(dv, block_v))](
        q, k, v, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g_or_a, beta_or_b, g_or_a.stride(0), beta_or_b.stride(0), A_log, dt_bias,
        ssm_state, b_state_idx, *ssm_state.stride(), o, o.stride(0), o.stride(1),
        dk, dv, dk**-0.5,
        REP=nv // nk, FUSED_GATES=fused_gates, BLOCK_K=block_k, BLOCK_V=block_v,
        num_warps=2 if block_k * block_v <= 4096 else (4 if block_k * block_v <= 8192 else 8), **pdl_args(q),
    )
    return o


def gated_delta_rule_decode_triton(q, k, v, g, beta, ssm_state, b_state_idx, block_v=None) -> torch.Tensor:
    """Triton path of gated_delta_rule_decode (arguments validated by the caller)."""
    return _launch_decode(q, k, v, g, beta, g, beta, ssm_state, b_state_idx, False, block_v)


def gated_delta_rule_decode_fused_triton(
    qkv, conv_weight, conv_state, b_conv_idx, a, b, A_log, dt_bias, ssm_state, b_ssm_idx, nk, dk, dv, block_v=None
) -> torch.Tensor:
    """Triton path of gated_delta_rule_decode_fused (arguments validated by the caller): two launches, the conv
    update writing q|k|v in qkv.dtype (the reference's rounding), then the recurrence with the gates in-kernel."""
    bsz, nv = a.shape
    x = causal_conv1d_update_triton(qkv, conv_weight, conv_state, b_conv_idx)
    key_dim = nk * dk
    q = x[:, :key_dim].view(bsz, nk, dk)
    k = x[:, key_dim : 2 * key_dim].view(bsz, nk, dk)
    v = x[:, 2 * key_dim :].view(bsz, nv, dv)
    return _launch_decode(q, k, v, a, b, A_log, dt_bias, ssm_state, b_ssm_idx, True, block_v)


if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.gdn.gdn_gating import gdn_gates
    from lightllm_mtp.kernels.pdl import pdl_wait

    @triton.jit
    def _gdr_decode_kernel(
        q_ptr, k_ptr, v_ptr, sq_b, sq_h, sk_b, sk_h, sv_b, sv_h,
        ga_ptr, bb_ptr, s_ga, s_bb, A_log_ptr, dt_bias_ptr,
        state_ptr, idx_ptr, ss_s, ss_h, ss_k, ss_v, o_ptr, so_b, so_h,
        DK, DV, scale,
        REP: tl.constexpr, FUSED_GATES: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, PDL: tl.constexpr,
    ):
        pdl_wait(PDL)
        # One (request, value head, V tile): S [dk, V tile] fp32 in registers.
        # S = exp(g) S; delta = beta (v - S^T k); S += k delta^T; o = S^T q  (q, k l2-normalised, q * dk^-0.5)
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        offs_k = tl.arange(0, BLOCK_K)
        offs_v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
        mask_k = offs_k < DK
        mask_v = offs_v < DV
        kh = h // REP
        q = tl.load(q_ptr + b * sq_b + kh * sq_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + b * sk_b + kh * sk_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
        v = tl.load(v_ptr + b * sv_b + h * sv_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        if FUSED_GATES:
            g, beta = gdn_gates(
                tl.load(ga_ptr + b * s_ga + h), tl.load(bb_ptr + b * s_bb + h), tl.load(A_log_ptr + h),
                tl.load(dt_bias_ptr + h),
            )
        else:
            g = tl.load(ga_ptr + b * s_ga + h).to(tl.float32)
            beta = tl.load(bb_ptr + b * s_bb + h).to(tl.float32)
        slot = tl.load(idx_ptr + b).to(tl.int64)
        s_ptrs = state_ptr + slot * ss_s + h * ss_h + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v
        mask_s = mask_k[:, None] & mask_v[None, :]
        S = tl.load(s_ptrs, mask=mask_s, other=0.0) * tl.exp(g)
        delta = beta * (v - tl.sum(S * k[:, None], axis=0))
        S = S + k[:, None] * delta[None, :]
        o = tl.sum(S * q[:, None], axis=0)
        tl.store(s_ptrs, S, mask=mask_s)
        tl.store(o_ptr + b * so_b + h * so_h + offs_v, o.to(o_ptr.dtype.element_ty), mask=mask_v)
