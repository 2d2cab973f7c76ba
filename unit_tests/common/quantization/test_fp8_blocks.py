"""Block-FP8 weights cut by tensor parallelism and joined by fused projections (common/quantization/fp8_blocks.py):
every result dequantizes to exactly the corresponding rows / columns of the checkpoint weight."""

import pytest
import torch

from lightllm_mtp.common.quantization.fp8_blocks import (Fp8LayoutError, cat_rows, common_grid, scale_rows_of_pieces,
                                                         shard_fp8, stack)
from lightllm_mtp.common.tensor_spec import TpShard
from lightllm_mtp.kernels.quant.fp8_block import MIN_BLOCK, quantize_fp8_block

GEN = torch.Generator().manual_seed(0)


def _full(rows, cols, block=(128, 128)):
    return quantize_fp8_block(torch.randn(rows, cols, generator=GEN), block)


def _shard(w, shard: TpShard, rank, size):
    """What the loader does: read this rank's pieces of the FP8 tensor, cut the whole scale to them."""
    full = w.shape[shard.dim]
    pieces = shard.ranges(full, rank, size)
    index = torch.cat([torch.arange(a, b) for a, b in pieces])
    q = w.qweight.index_select(shard.dim, index)
    return shard_fp8(q, w.scale, w.block, shard.dim, pieces, "w"), index


@pytest.mark.parametrize("rows,cols,shard,size", [
    (512, 256, TpShard(0), 2),  # aligned: keeps the 128 blocks
    (128, 256, TpShard(0), 2),  # 64-row shards of one block (tiny k_proj at tp=2)
    (256, 512, TpShard(1), 4),  # row-parallel columns
    (512, 256, TpShard(0, sections=(128, 128, 256), heads=(2, 2, 4)), 2),  # GDN [q | k | v] at tp=2
    (192, 96, TpShard(0), 2),  # partial blocks: 96-row shards, the second across a block boundary
])
def test_shards_dequantize_to_the_checkpoint_slices(rows, cols, shard, size):
    w = _full(rows, cols)
    whole = w.dequantize()
    for rank in range(size):
        local, index = _shard(w, shard, rank, size)
        torch.testing.assert_close(local.dequantize(), whole.index_select(shard.dim, index), rtol=0, atol=0)
        assert min(local.block) >= MIN_BLOCK


def test_aligned_shard_keeps_the_checkpoint_blocks_and_a_split_inside_keeps_its_scale():
    w = _full(512, 256)
    local, _ = _shard(w, TpShard(0), 1, 2)
    assert local.block == (128, 128) and torch.equal(local.scale, w.scale[2:])
    rows, g = scale_rows_of_pieces([(64, 128)], 128, "k_proj")
    assert (rows, g) == ([0], 64)


def test_a_shard_below_the_kernels_sub_block_fails_with_one_message():
    """35B-A3B-like experts at tp=8 in the tiny fixture's sizes: 64 / 8 = 8-row pieces of a 128 block."""
    w = _full(128, 256)
    with pytest.raises(Fp8LayoutError, match=rf"sub-blocks of 8 < {MIN_BLOCK} .*smaller tensor-parallel size"):
        _shard(w, TpShard(0, sections=(64, 64)), 0, 8)


def test_fused_rows_with_partial_blocks_regroup_exactly():
    """The tiny MoE expert: gate [64, 256] and up [64, 256] each with its own scale, fused into [128, 256]."""
    gate, up, other = _full(64, 256), _full(64, 256), _full(192, 256)
    fused = cat_rows([gate, up, other], "gate_up")
    assert fused.block == (64, 128)
    want = torch.cat([gate.dequantize(), up.dequantize(), other.dequantize()])
    torch.testing.assert_close(fused.dequantize(), want, rtol=0, atol=0)
    experts = stack([cat_rows([_full(64, 256), _full(64, 256)], "e") for _ in range(3)], "experts")
    assert experts.shape == (3, 128, 256) and experts.scale.shape == (3, 2, 2)
    shared = _full(256, 256)
    a, b = common_grid([experts, shared], "shared")
    assert a.block == b.block == (64, 128) and b.scale.shape == (4, 2)
    torch.testing.assert_close(b.dequantize(), shared.dequantize(), rtol=0, atol=0)


def test_fusing_a_piece_off_the_sub_block_grid_fails():
    with pytest.raises(Fp8LayoutError, match="sub-blocks of 8"):
        cat_rows([_full(8, 256), _full(64, 256)], "q + k")
