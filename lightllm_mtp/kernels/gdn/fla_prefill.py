"""fla-core's chunked gated-delta-rule kernel behind gated_delta_rule_prefill on the GPU: the call (native GVA, q / k
as given or L2-normalised by fla) and its varlen chunk table, made once per forward on the host so that no layer's call
reads the device."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lightllm_mtp.env import ENV
from lightllm_mtp.kernels.triton_utils import to_device_async


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


FLA_CHUNK_SIZE = 64  # tokens per chunk of fla's kernel (passed to it explicitly)


@dataclass(frozen=True)
class PrefillChunks:
    """fla's varlen chunk table of one batch, made once per forward so that no layer's call reads the device:
    cu_seqlens [B+1] int64 (the same tensor object for every layer, so fla's per-tensor caches hit) and
    chunk_indices [NT, 2] int64 (request, chunk within it) of every FLA_CHUNK_SIZE-token chunk, or None when the
    host does not know the request lengths (fla then derives it, with a host sync)."""

    cu_seqlens: torch.Tensor
    chunk_indices: torch.Tensor | None


def chunk_rows(q_lens: Sequence[int]) -> list[tuple[int, int]]:
    """(request, chunk within it) of every FLA_CHUNK_SIZE-token chunk of requests with these lengths, in fla's order."""
    return [(b, i) for b, n in enumerate(q_lens) for i in range(-(-n // FLA_CHUNK_SIZE))]


def prefill_chunks(b1_cu_q_len: torch.Tensor, host_q_lens: Sequence[int] | None) -> PrefillChunks:
    """PrefillChunks of a batch: b1_cu_q_len [B+1] (device), host_q_lens the B request lengths as the host knows
    them (the same values; not checked: that would read the device)."""
    if host_q_lens is not None and len(host_q_lens) + 1 != b1_cu_q_len.shape[0]:
        raise ValueError(f"prefill_chunks: {len(host_q_lens)} host lengths for b1_cu_q_len of shape "
                         f"{list(b1_cu_q_len.shape)}")  # fmt: skip
    indices = None
    if host_q_lens is not None:
        rows = [x for row in chunk_rows(host_q_lens) for x in row]
        indices = to_device_async(torch.tensor(rows, dtype=torch.int64).view(-1, 2), b1_cu_q_len.device)
    return PrefillChunks(b1_cu_q_len.to(torch.int64), indices)


def prefill_fla(
    q, k, v, g, beta, ssm_state, b_state_idx, b1_cu_q_len, b_has_initial_state, qk_normalized, chunks
) -> torch.Tensor:
    """Varlen fla chunk kernel. GVA natively (value head h reads key head h // (nv // nk), as the reference), q, k, v
    passed as they are (fla copies non-contiguous inputs: causal_conv1d_prefill_qkv's planes are contiguous)."""
    slots = b_state_idx.long()
    init = ssm_state[slots].masked_fill_(~b_has_initial_state[:, None, None, None], 0.0)  # one gather, no zeros
    if chunks is None:
        chunks = PrefillChunks(b1_cu_q_len.to(torch.int64), None)
    o, final = fla_chunk_kernel()(
        q=q.unsqueeze(0),
        k=k.unsqueeze(0),
        v=v.unsqueeze(0),
        g=g.unsqueeze(0),
        beta=beta.to(v.dtype).unsqueeze(0),
        scale=q.shape[-1] ** -0.5,
        initial_state=init,
        output_final_state=True,
        cu_seqlens=chunks.cu_seqlens,
        chunk_indices=chunks.chunk_indices,
        use_qk_l2norm_in_kernel=not qk_normalized,
        chunk_size=FLA_CHUNK_SIZE,
    )
    ssm_state[slots] = final.float()
    return o.squeeze(0).to(v.dtype)
