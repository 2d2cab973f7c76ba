"""Gated delta rule over speculative verify blocks with per-position SSM state rows.

Each request owns `rows_per_req = 1 + mtp_step` consecutive fp32 state rows starting at `b_state_base`.
The committed state is row `accept_len - 1` (row 0 after prefill). A verify block of q tokens starts from
that row and writes the state after token i into row i, so accepting a tokens leaves the committed state in
row a-1: rollback is an index, not a copy.
"""

from __future__ import annotations

import torch

from lightllm_mtp.kernels.gdn.gated_delta_rule import gated_delta_rule_decode_ref
from lightllm_mtp.kernels.gdn.gdn_gating import gdn_gating
from lightllm_mtp.kernels.triton_utils import num_sms, triton_available, use_triton


def _check_verify_args(op, q, k, v, gate_a, gate_b, ssm_state, b_state_base, b1_cu_q_len, b_accept_len) -> None:
    if q.shape != k.shape or q.ndim != 3 or v.ndim != 3 or q.shape[0] != v.shape[0]:
        raise ValueError(f"{op}: bad q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if gate_a.shape != v.shape[:2] or gate_b.shape != v.shape[:2]:
        raise ValueError(f"{op}: the gate inputs must be [T, nv] = {list(v.shape[:2])}")
    if ssm_state.dtype != torch.float32 or ssm_state.shape[1:] != (v.shape[1], q.shape[2], v.shape[2]):
        got = f"{ssm_state.dtype} {tuple(ssm_state.shape)}"
        raise ValueError(f"{op}: ssm_state must be fp32 [R, nv, dk, dv], got {got}")
    if b_state_base.shape != b_accept_len.shape or b1_cu_q_len.shape[0] != b_state_base.shape[0] + 1:
        raise ValueError(f"{op}: b_state_base, b_accept_len must be [B], b1_cu_q_len [B+1]")


def gated_delta_rule_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    *,
    b_state_base: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_accept_len: torch.Tensor,
    max_q_len: int | None = None,
) -> torch.Tensor:
    """q, k [T, nk, dk]; v [T, nv, dv]; g, beta [T, nv] fp32 (from gdn_gating); ssm_state [R, nv, dk, dv] fp32;
    b_state_base, b_accept_len [B]; b1_cu_q_len [B+1]; max_q_len: host bound on block length (None: 8).
    Returns o [T, nv, dv] in v.dtype."""
    _check_verify_args("gated_delta_rule_verify", q, k, v, g, beta, ssm_state, b_state_base, b1_cu_q_len, b_accept_len)
    if use_triton(q):
        return _verify_triton(q, k, v, g, beta, ssm_state, b_state_base, b1_cu_q_len, b_accept_len, max_q_len or 8)
    return gated_delta_rule_verify_ref(q, k, v, g, beta, ssm_state, b_state_base, b1_cu_q_len, b_accept_len)


def gated_delta_rule_verify_fused_gates(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    ssm_state: torch.Tensor,
    *,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    b_state_base: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_accept_len: torch.Tensor,
    max_q_len: int | None = None,
) -> torch.Tensor:
    """gdn_gating(a, b, A_log, dt_bias) then gated_delta_rule_verify, the gates computed inside the kernel (one
    launch less per layer). a, b [T, nv] raw gate projections (row-strided views allowed); A_log, dt_bias [nv]."""
    op = "gated_delta_rule_verify_fused_gates"
    _check_verify_args(op, q, k, v, a, b, ssm_state, b_state_base, b1_cu_q_len, b_accept_len)
    if A_log.shape != (v.shape[1],) or dt_bias.shape != (v.shape[1],):
        raise ValueError(f"{op}: A_log and dt_bias must be [nv] = [{v.shape[1]}]")
    if use_triton(q):
        return _verify_triton(
            q, k, v, a, b, ssm_state, b_state_base, b1_cu_q_len, b_accept_len, max_q_len or 8, A_log, dt_bias
        )
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    return gated_delta_rule_verify_ref(q, k, v, g, beta, ssm_state, b_state_base, b1_cu_q_len, b_accept_len)


def _verify_triton(
    q, k, v, g, beta, ssm_state, b_state_base, b1_cu_q_len, b_accept_len, max_q_len, A_log=None, dt_bias=None
):
    nk, dk = q.shape[1], q.shape[2]
    nv, dv = v.shape[1], v.shape[2]
    q, k, v = (t if t.stride(2) == 1 else t.contiguous() for t in (q, k, v))
    g, beta = (t if t.stride(1) == 1 else t.contiguous() for t in (g, beta))
    fused = A_log is not None
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)  # contiguous even when v is a column slice
    # the decode kernel's tiling rule (gated_delta_rule._launch_decode): V tiles of 64 once there are ~16 programs
    # per SM (large batches stream the state faster), 32 below
    small = b_state_base.shape[0] * nv * triton.cdiv(dv, 32) < 16 * num_sms(v.device)
    block_v = min(triton.next_power_of_2(dv), 32 if small else 64)
    block_k = triton.next_power_of_2(dk)
    grid = (b_state_base.shape[0], nv, triton.cdiv(dv, block_v))
    _gdn_verify_kernel[grid](
        q, k, v, g, beta, A_log if fused else g, dt_bias if fused else g, ssm_state, b_state_base, b1_cu_q_len,
        b_accept_len, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        ssm_state.stride(0), ssm_state.stride(1), ssm_state.stride(2), g.stride(0), beta.stride(0),
        dk ** -0.5, GROUP=nv // nk, DK=dk, DV=dv, BLOCK_K=block_k, BLOCK_V=block_v,
        MAX_Q=max_q_len, FUSED_GATES=fused,
        num_warps=2 if block_k * block_v <= 4096 else (4 if block_k * block_v <= 8192 else 8),
    )
    return out


if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.gdn.gdn_gating import gdn_gates

    @triton.jit
    def _gdn_verify_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, state_ptr, base_ptr, cu_ptr, acc_ptr, out_ptr,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_sr, stride_sh, stride_sk,
        stride_gt, stride_bt, scale, GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BLOCK_K: tl.constexpr,
        BLOCK_V: tl.constexpr, MAX_Q: tl.constexpr, FUSED_GATES: tl.constexpr,
    ):  # with FUSED_GATES, g_ptr / beta_ptr hold the raw gate inputs a / b
        # One program per (request, value head, V tile): the [dk, V tile] state slice lives in registers from the
        # committed row (accept_len - 1) through the block; the state after token i is stored in row base + i.
        b = tl.program_id(0)
        h = tl.program_id(1)
        offs_v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
        offs_k = tl.arange(0, BLOCK_K)
        mask_k = offs_k < DK
        mask_v = offs_v < DV
        mask_s = mask_k[:, None] & mask_v[None, :]
        kh = h // GROUP
        base = tl.load(base_ptr + b).to(tl.int64)
        start = tl.load(cu_ptr + b)
        q_len = tl.load(cu_ptr + b + 1) - start
        read_row = base + tl.load(acc_ptr + b) - 1
        s_off = h * stride_sh + offs_k[:, None] * stride_sk + offs_v[None, :]
        state = tl.load(state_ptr + read_row * stride_sr + s_off, mask=mask_s, other=0.0)
        for i in range(MAX_Q):
            if i < q_len:
                t = start + i
                qv = tl.load(q_ptr + t * stride_qt + kh * stride_qh + offs_k, mask=mask_k, other=0.0).to(tl.float32)
                kv = tl.load(k_ptr + t * stride_kt + kh * stride_kh + offs_k, mask=mask_k, other=0.0).to(tl.float32)
                qv = qv * tl.rsqrt(tl.sum(qv * qv) + 1e-6) * scale
                kv = kv * tl.rsqrt(tl.sum(kv * kv) + 1e-6)
                vv = tl.load(v_ptr + t * stride_vt + h * stride_vh + offs_v, mask=mask_v, other=0.0).to(tl.float32)
                if FUSED_GATES:
                    g, beta = gdn_gates(tl.load(g_ptr + t * stride_gt + h), tl.load(beta_ptr + t * stride_bt + h),
                                        tl.load(A_log_ptr + h), tl.load(dt_bias_ptr + h))  # fmt: skip
                else:
                    g = tl.load(g_ptr + t * stride_gt + h)
                    beta = tl.load(beta_ptr + t * stride_bt + h)
                state = state * tl.exp(g)
                delta = beta * (vv - tl.sum(state * kv[:, None], axis=0))
                state = state + kv[:, None] * delta[None, :]
                o = tl.sum(state * qv[:, None], axis=0)
                tl.store(out_ptr + t * stride_ot + h * stride_oh + offs_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
                tl.store(state_ptr + (base + i) * stride_sr + s_off, state, mask=mask_s)


def gated_delta_rule_verify_ref(q, k, v, g, beta, ssm_state, b_state_base, b1_cu_q_len, b_accept_len):
    out = torch.empty_like(v)
    cu = b1_cu_q_len.tolist()
    max_q = max(b - a for a, b in zip(cu, cu[1:]))
    base = b_state_base.long()
    read_rows = base + b_accept_len.long() - 1
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
