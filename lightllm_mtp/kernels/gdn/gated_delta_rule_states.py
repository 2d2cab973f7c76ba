"""Gated delta rule prefill that also copies out the fp32 state after chosen token counts of each request (the
prefix cache's GDN snapshots), in the same pass as the prefill.

On the GPU it runs fla-core's chunked forward (the steps of fla's chunk_gated_delta_rule, with the same kernels),
except that the per-chunk states `h` of the inter-chunk recurrence are written in fp32 instead of the input dtype:
h[c] is then exactly the fp32 state the kernel carries into chunk c (the value the final state would have if the
sequence ended there), so a saved state equals a prefill that stops at that token. The output reads h rounded to
the input dtype, the rounding fla's kernel applies when it writes h itself, so o is the plain prefill's. A saved
count must therefore be a multiple of CHUNK (fla's chunk) or the request's whole length (its final state);
`state_save_alignment` says what the caller must split at. The reference saves anywhere (per-token recurrence)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from lightllm_mtp.kernels._validate import check_dtype, check_shape
from lightllm_mtp.kernels.gdn.fla_prefill import FLA_CHUNK_SIZE, PrefillChunks, chunk_rows, fla_chunk_kernel
from lightllm_mtp.kernels.gdn.gated_delta_rule import (
    _check_common,
    gated_delta_rule_prefill,
    gated_delta_rule_prefill_ref,
)
from lightllm_mtp.kernels.triton_utils import to_device_async

CHUNK = FLA_CHUNK_SIZE  # fla's chunk length


@dataclass(frozen=True)
class StateSaves:
    """Where one prefill call saves states; built on the host once per forward (no device->host read later)."""

    q_lens: tuple[int, ...]  # rows of each request of the call
    saves: tuple[tuple[int, int, int], ...]  # (request, rows consumed 1..q_len, destination row of states_out)
    cu_seqlens: torch.Tensor  # [B+1] int64 (device)
    chunk_indices: torch.Tensor  # [NT, 2] int64: fla's (request, chunk) of every chunk of the call
    chunk_offsets: torch.Tensor  # [B+1] int64: first chunk of each request
    inner_chunk: torch.Tensor  # [Ni] int64: chunk whose starting state is saved
    inner_dest: torch.Tensor  # [Ni] int64
    final_b: torch.Tensor  # [Nf] int64: request whose final state is saved
    final_dest: torch.Tensor  # [Nf] int64


def make_state_saves(q_lens: list[int], saves: list[tuple[int, int, int]], device: torch.device) -> StateSaves:
    """q_lens: rows per request; saves: (request, rows consumed, destination row). One host->device copy."""
    cu, offsets = [0], [0]
    for b, n in enumerate(q_lens):
        if n <= 0:
            raise ValueError(f"make_state_saves: request {b} has {n} rows")
        cu.append(cu[-1] + n)
        offsets.append(offsets[-1] + -(-n // CHUNK))
    chunk_idx = [x for row in chunk_rows(q_lens) for x in row]
    inner, final = [], []
    for b, t, dest in saves:
        if not 0 <= b < len(q_lens) or not 0 < t <= q_lens[b]:
            raise ValueError(f"make_state_saves: save ({b}, {t}) outside the call's {len(q_lens)} requests {q_lens}")
        if t == q_lens[b]:
            final.append((b, dest))
        else:
            inner.append((offsets[b] + t // CHUNK, dest))  # exact only when t % CHUNK == 0 (checked on use)
    parts = [cu, chunk_idx, offsets, [c for c, _ in inner], [d for _, d in inner], [b for b, _ in final],
             [d for _, d in final]]  # fmt: skip
    # each part starts 16-byte aligned: Triton specializes pointers on it, and a part at an odd offset (B even) would
    # compile fla's kernels a second time, seconds in the middle of serving
    starts = [sum(len(q) + len(q) % 2 for q in parts[:i]) for i in range(len(parts))]
    host = torch.zeros(starts[-1] + len(parts[-1]), dtype=torch.int64)
    for p, at in zip(parts, starts):
        host[at : at + len(p)] = torch.tensor(p, dtype=torch.int64)
    flat = to_device_async(host, device)
    views = [flat[at : at + len(p)] for p, at in zip(parts, starts)]
    views[1] = views[1].view(-1, 2)
    return StateSaves(tuple(q_lens), tuple(saves), *views)


def state_save_alignment(device: torch.device) -> int:
    """Saved token counts (other than a request's whole chunk) must be multiples of this on `device` (without fla's
    forward steps, e.g. another fla version, only whole chunks: the caller splits at every boundary)."""
    if device.type != "cuda" or fla_chunk_kernel() is None:
        return 1
    return CHUNK if _fla_parts() is not None else _WHOLE_ONLY


_WHOLE_ONLY = 1 << 62


def gated_delta_rule_prefill_states(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    states_out: torch.Tensor,
    *,
    b_state_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_has_initial_state: torch.Tensor,
    saves: StateSaves,
    qk_normalized: bool = False,
) -> torch.Tensor:
    """gated_delta_rule_prefill (same arguments, same o and final states) that also writes, for each
    (request b, count t, row d) of `saves`, the state after b's first t rows into states_out[d] [S, nv, dk, dv]
    fp32. On the GPU every t must be a multiple of state_save_alignment() or b's whole length. qk_normalized: q, k
    are already L2-normalised (causal_conv1d_prefill_qkv), as in gated_delta_rule_prefill."""
    op = "gated_delta_rule_prefill_states"
    _check_common(op, q, k, v, g, beta, ssm_state, b_state_idx)
    bsz = b_state_idx.shape[0]
    check_shape(op, "b1_cu_q_len", b1_cu_q_len, (bsz + 1,), "[B+1]")
    check_shape(op, "b_has_initial_state", b_has_initial_state, (bsz,), "[B]")
    check_dtype(op, "b_has_initial_state", b_has_initial_state, (torch.bool,))
    check_shape(op, "states_out", states_out, (None, *ssm_state.shape[1:]), "[S, nv, dk, dv] like ssm_state rows")
    check_dtype(op, "states_out", states_out, (torch.float32,))
    if len(saves.q_lens) != bsz or sum(saves.q_lens) != q.shape[0]:
        raise ValueError(f"{op}: saves describe {len(saves.q_lens)} requests / {sum(saves.q_lens)} rows, the call "
                         f"has {bsz} / {q.shape[0]}")  # fmt: skip
    align = state_save_alignment(q.device)
    bad = [(b, t) for b, t, _ in saves.saves if t != saves.q_lens[b] and t % align]
    if bad:
        raise ValueError(f"{op}: saved counts {bad} are not multiples of {align} nor whole lengths")
    if align == CHUNK:
        return _prefill_states_fla(q, k, v, g, beta, ssm_state, states_out, b_state_idx, b_has_initial_state, saves,
                                   qk_normalized)  # fmt: skip
    if align == _WHOLE_ONLY:  # final states only: the plain prefill, then copies
        o = gated_delta_rule_prefill(q, k, v, g, beta, ssm_state, b_state_idx=b_state_idx, b1_cu_q_len=saves.cu_seqlens,
                                     b_has_initial_state=b_has_initial_state, qk_normalized=qk_normalized,
                                     chunks=PrefillChunks(saves.cu_seqlens, saves.chunk_indices))  # fmt: skip
        states_out[saves.final_dest] = ssm_state[b_state_idx.long()[saves.final_b]]
        return o
    real = (b1_cu_q_len[1:] - b1_cu_q_len[:-1]).tolist()  # fewer than q_lens under a prefill graph's padding
    return gated_delta_rule_prefill_ref(
        q, k, v, g, beta, ssm_state, b_state_idx, b1_cu_q_len, b_has_initial_state, qk_normalized,
        saves=[(b, real[b] if t == saves.q_lens[b] else t, d) for b, t, d in saves.saves], states_out=states_out,
    )  # fmt: skip


@functools.cache
def _fla_parts():
    """The fla-core pieces of chunk_gated_delta_rule's forward (fla-core 0.6.0), or None."""
    if fla_chunk_kernel() is None:
        return None
    try:
        from fla.modules.norm.l2norm import l2norm_fwd
        from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_kernel_h_blockdim64
        from fla.ops.common.chunk_o import chunk_fwd_o
        from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
        from fla.ops.utils import chunk_local_cumsum
        from fla.ops.utils.constant import RCP_LN2
    except ImportError:
        return None
    return l2norm_fwd, chunk_local_cumsum, RCP_LN2, chunk_gated_delta_rule_fwd_intra, \
        chunk_gated_delta_rule_fwd_kernel_h_blockdim64, chunk_fwd_o  # fmt: skip


def _prefill_states_fla(q, k, v, g, beta, ssm_state, states_out, b_state_idx, b_has_initial_state, saves,
                        qk_normalized):  # fmt: skip
    """fla's chunk_gated_delta_rule forward step by step (GVA natively, as the plain prefill's fla call), with the
    chunk states h in fp32; cu_seqlens / chunk indices from the host-built saves (no device->host read)."""
    l2norm_fwd, chunk_local_cumsum, rcp_ln2, fwd_intra, fwd_h_kernel, chunk_fwd_o = _fla_parts()
    nk, nv, dk, dv = q.shape[1], v.shape[1], q.shape[2], v.shape[2]
    slots = b_state_idx.long()
    init = ssm_state.index_select(0, slots).masked_fill_(~b_has_initial_state[:, None, None, None], 0.0)
    cu, chunk_indices = saves.cu_seqlens, saves.chunk_indices
    q, k, v = (x.unsqueeze(0).contiguous() for x in (q, k, v))
    g, beta = g.unsqueeze(0).contiguous(), beta.to(v.dtype).unsqueeze(0).contiguous()
    if not qk_normalized:
        q, _ = l2norm_fwd(q)
        k, _ = l2norm_fwd(k)
    g = chunk_local_cumsum(g, chunk_size=CHUNK, scale=rcp_ln2, cu_seqlens=cu, chunk_indices=chunk_indices)
    w, u, _ = fwd_intra(k=k, v=v, g=g, beta=beta, cu_seqlens=cu, chunk_indices=chunk_indices, chunk_size=CHUNK)
    num_chunks, bsz = chunk_indices.shape[0], slots.shape[0]
    h = torch.empty(1, num_chunks, nv, dk, dv, dtype=torch.float32, device=q.device)
    v_new = torch.empty_like(u)
    final = torch.zeros(bsz, nv, dk, dv, dtype=torch.float32, device=q.device)
    fwd_h_kernel[lambda meta: (triton.cdiv(dv, meta["BV"]) * bsz * nv,)](
        k=k, v=u, w=w, v_new=v_new, g=g, gk=None, h=h, h0=init, ht=final, cu_seqlens=cu,
        chunk_offsets=saves.chunk_offsets, T=q.shape[1], H=nk, HV=nv, K=dk, V=dv, BT=CHUNK, STATE_V_FIRST=False,
    )  # fmt: skip
    if saves.inner_chunk.numel():
        states_out[saves.inner_dest] = h[0, saves.inner_chunk]
    o = chunk_fwd_o(q=q, k=k, v=v_new, h=h.to(k.dtype), g=g, scale=dk**-0.5, cu_seqlens=cu, chunk_size=CHUNK,
                    chunk_indices=chunk_indices)  # fmt: skip
    ssm_state[slots] = final
    if saves.final_b.numel():
        states_out[saves.final_dest] = final[saves.final_b]
    return o.squeeze(0).to(v.dtype)


try:
    import triton
except ImportError:  # CPU machines without Triton: the reference path only
    triton = None
