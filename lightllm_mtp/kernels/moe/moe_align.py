"""Expert-major row layout for the small-T MoE pass: (token, slot) pairs grouped by expert, each expert's group
padded to a multiple of BLOCK_M, so one tile of rows reads its expert's weights once. Graph-safe: the output sizes
depend only on (T, k', E', BLOCK_M); unused blocks are marked with expert -1 on the device."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_index, check_shape
from lightllm_mtp.kernels.triton_utils import triton_available

_OP = "moe_align"
_CHUNK = 128  # pairs ranked per program


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound on sum_e ceil(count_e / BLOCK_M) over any routing of `num_pairs` pairs to `num_experts`."""
    return (num_pairs + min(num_experts, num_pairs) * (block_m - 1)) // block_m


def moe_align_ref(topk_ids: torch.Tensor, *, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids [T, k'] -> (sorted_pairs [max_blocks * BLOCK_M] int32, block_expert [max_blocks] int32).

    Pair p = t * k' + slot. Experts in id order, each expert's pairs in increasing p, its group padded with the
    sentinel T * k' to a multiple of BLOCK_M; block_expert[b] = the expert of rows [b*BLOCK_M, (b+1)*BLOCK_M), -1
    past the last used block."""
    flat = topk_ids.reshape(-1).long()
    n_pairs = flat.numel()
    blocks = max_blocks(n_pairs, num_experts, block_m)
    sorted_pairs = torch.full((blocks * block_m,), n_pairs, dtype=torch.int32, device=topk_ids.device)
    block_expert = torch.full((blocks,), -1, dtype=torch.int32, device=topk_ids.device)
    start = 0
    for e in range(num_experts):
        pairs = torch.nonzero(flat == e).flatten()
        if pairs.numel() == 0:
            continue
        sorted_pairs[start * block_m : start * block_m + pairs.numel()] = pairs.to(torch.int32)
        n_blocks = -(-pairs.numel() // block_m)
        block_expert[start : start + n_blocks] = e
        start += n_blocks
    return sorted_pairs, block_expert


def moe_align(topk_ids: torch.Tensor, *, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """See moe_align_ref; ids must lie in [0, num_experts). Rows of the padding slots are never read by a
    consumer that masks pairs >= T * k' (the Triton kernel leaves them as the sentinel too)."""
    check_shape(_OP, "topk_ids", topk_ids, (None, None), "[T, k]")
    check_index(_OP, "topk_ids", topk_ids)
    if block_m < 1 or block_m & (block_m - 1):
        raise ValueError(f"{_OP}: block_m must be a power of two, got {block_m}")
    if topk_ids.is_cuda and triton_available():
        return moe_align_triton(topk_ids, num_experts=num_experts, block_m=block_m)
    return moe_align_ref(topk_ids, num_experts=num_experts, block_m=block_m)


def moe_align_triton(topk_ids: torch.Tensor, *, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    n_pairs = ids.numel()
    blocks = max_blocks(n_pairs, num_experts, block_m)
    sorted_pairs = torch.empty(blocks * block_m, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=ids.device)
    if n_pairs == 0:
        return sorted_pairs, block_expert
    grid = triton.cdiv(n_pairs, _CHUNK)
    num_bins = triton.next_power_of_2(num_experts)
    scratch = torch.empty(grid, num_bins, dtype=torch.int32, device=ids.device)
    _moe_align_kernel[(grid,)](
        ids, sorted_pairs, block_expert, scratch, n_pairs, num_experts, blocks,
        BLOCK_M=block_m, NUM_BINS=num_bins, CHUNK=_CHUNK, BLOCK_B=min(triton.next_power_of_2(blocks), 1024),
    )  # fmt: skip
    return sorted_pairs, block_expert


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _moe_align_kernel(
        ids_ptr, sorted_ptr, block_expert_ptr, scratch_ptr, P, E, MAX_BLOCKS,
        BLOCK_M: tl.constexpr, NUM_BINS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_B: tl.constexpr,
    ):  # fmt: skip
        # Every program histograms all P ids (cheap) to get each expert's first block; it then ranks its own CHUNK
        # pairs among the earlier pairs of the same expert and writes them. Program 0 writes the block -> expert
        # map and the padding sentinels. Writes never overlap, so no inter-program sync is needed.
        pid = tl.program_id(0)
        bins = tl.arange(0, NUM_BINS)
        lanes = tl.arange(0, CHUNK)
        counts = tl.zeros([NUM_BINS], dtype=tl.int32)
        for q0 in range(0, P, CHUNK):
            q_mask = q0 + lanes < P
            q_ids = tl.load(ids_ptr + q0 + lanes, mask=q_mask, other=0).to(tl.int32)
            counts += tl.histogram(q_ids, NUM_BINS, mask=q_mask)
        counts = tl.where(bins < E, counts, 0)
        n_blocks = (counts + BLOCK_M - 1) // BLOCK_M
        first_block = tl.cumsum(n_blocks, axis=0) - n_blocks
        tl.store(scratch_ptr + pid * NUM_BINS + bins, first_block)
        tl.debug_barrier()  # the scratch row is read back (gathered) by this program's other threads

        p = pid * CHUNK + lanes
        p_valid = p < P
        p_ids = tl.load(ids_ptr + p, mask=p_valid, other=E).to(tl.int32)
        rank = tl.zeros([CHUNK], dtype=tl.int32)
        for q0 in range(0, pid * CHUNK + CHUNK, CHUNK):
            q = q0 + lanes
            q_ids = tl.load(ids_ptr + q, mask=q < P, other=-1).to(tl.int32)
            same = (q_ids[None, :] == p_ids[:, None]) & (q[None, :] < p[:, None])
            rank += tl.sum(same.to(tl.int32), axis=1)
        start = tl.load(scratch_ptr + pid * NUM_BINS + p_ids, mask=p_valid, other=0)
        tl.store(sorted_ptr + start * BLOCK_M + rank, p, mask=p_valid)

        if pid == 0:
            used = tl.sum(n_blocks, axis=0)
            for j in range(0, tl.max(n_blocks, axis=0)):
                tl.store(block_expert_ptr + first_block + j, bins, mask=j < n_blocks)
            pad = n_blocks * BLOCK_M - counts
            for j in range(0, BLOCK_M):
                tl.store(sorted_ptr + first_block * BLOCK_M + counts + j, P, mask=j < pad)
            b_lanes = tl.arange(0, BLOCK_B)
            for b0 in range(0, MAX_BLOCKS, BLOCK_B):
                b = b0 + b_lanes
                tl.store(block_expert_ptr + b, -1, mask=(b >= used) & (b < MAX_BLOCKS))
