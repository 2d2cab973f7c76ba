"""Block-FP8 weights cut and joined along their block grid: tensor-parallel shards, fused projections ([q | k | v],
[gate | up]), per-expert tensors stacked into [E, 2I, H].

A piece that starts inside a checkpoint block (a 64-row tp shard of a 128-row block, the 64-row gate of a tiny expert
followed by its up rows) is regrouped into sub-blocks of the largest power of two g dividing every piece's start and
length (and the block): sub-block j of a piece starting at global row a carries the scale of checkpoint block
(a + g j) // block. That is exact (each sub-block lies inside one checkpoint block) and the kernels take any block
>= MIN_BLOCK; a split that would need sub-blocks smaller than that fails at start-up with one message."""

from __future__ import annotations

import math

import torch

from lightllm_mtp.kernels.quant.fp8_block import MIN_BLOCK, Fp8BlockWeight


class Fp8LayoutError(ValueError):
    """A shard or fusion of block-FP8 weights that the kernels cannot take."""


def _pow2_gcd(*values: int) -> int:
    """The largest power of two dividing every value (values of 0 divide by anything)."""
    g = 0
    for v in values:
        g = math.gcd(g, v)
    return g & -g if g else 0


def _check_sub_block(g: int, what: str) -> None:
    if g < MIN_BLOCK:
        raise Fp8LayoutError(
            f"{what}: the FP8 scale blocks would have to be split into sub-blocks of {g} < {MIN_BLOCK} rows / columns "
            f"(pieces must start and end on multiples of {MIN_BLOCK} within the checkpoint's blocks); use a smaller "
            "tensor-parallel size, or a 16-bit checkpoint"
        )


def scale_rows_of_pieces(pieces: list[tuple[int, int]], block: int, what: str) -> tuple[list[int], int]:
    """(for each sub-block of the concatenated pieces, the index of its checkpoint block; the sub-block size) of
    pieces [start, stop) along one dim of a tensor blocked by `block`."""
    lengths = [b - a for a, b in pieces]
    g = _pow2_gcd(block, *(a for a, _ in pieces), *lengths[:-1])
    _check_sub_block(g, what)
    rows = [(a + g * j) // block for (a, b) in pieces for j in range(-(-(b - a) // g))]
    return rows, g


def shard_fp8(qweight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], dim: int | None,
              pieces: list[tuple[int, int]] | None, what: str) -> Fp8BlockWeight:  # fmt: skip
    """This rank's weight from its pieces of the checkpoint tensor (`qweight` already read as those pieces,
    concatenated along dim; `scale` the checkpoint's whole scale). dim None: not sharded."""
    scale = scale.float()
    if dim is None or pieces is None:
        return Fp8BlockWeight(qweight, scale.contiguous(), block)
    axis = dim - qweight.ndim  # -2 (rows) or -1 (columns)
    side = block[0] if axis == -2 else block[1]
    rows, g = scale_rows_of_pieces(pieces, side, what)
    local = scale.index_select(scale.ndim + axis, torch.tensor(rows, dtype=torch.long, device=scale.device))
    new_block = (g, block[1]) if axis == -2 else (block[0], g)
    return Fp8BlockWeight(qweight, local.contiguous(), new_block)


def regroup(weight: Fp8BlockWeight, block: tuple[int, int]) -> Fp8BlockWeight:
    """The same weight with smaller blocks (each side dividing the current one): scales repeated."""
    (bn, bk), (nn, nk) = weight.block, block
    if (nn, nk) == (bn, bk):
        return weight
    assert bn % nn == 0 and bk % nk == 0, (weight.block, block)
    rows, cols = weight.shape[-2:]
    s = weight.scale.repeat_interleave(bn // nn, dim=-2)[..., : -(-rows // nn), :]
    s = s.repeat_interleave(bk // nk, dim=-1)[..., : -(-cols // nk)]
    return Fp8BlockWeight(weight.qweight, s.contiguous(), (nn, nk))


def cat_rows(parts: list[Fp8BlockWeight], what: str) -> Fp8BlockWeight:
    """Parts concatenated along their output rows (dim -2), each part's rows a whole number of sub-blocks."""
    if len(parts) == 1:
        return parts[0]
    lengths = [p.shape[-2] for p in parts]
    g = _pow2_gcd(*(p.block[0] for p in parts), *lengths[:-1])
    _check_sub_block(g, what)
    k = _pow2_gcd(*(p.block[1] for p in parts))
    _check_sub_block(k, what)
    parts = [regroup(p, (g, k)) for p in parts]
    return Fp8BlockWeight(torch.cat([p.qweight for p in parts], dim=-2).contiguous(),
                          torch.cat([p.scale for p in parts], dim=-2).contiguous(), (g, k))  # fmt: skip


def stack(parts: list[Fp8BlockWeight], what: str) -> Fp8BlockWeight:
    """Same-shape weights (experts) stacked on a new dim 0, on their common (smallest) blocks."""
    block = (_pow2_gcd(*(p.block[0] for p in parts)), _pow2_gcd(*(p.block[1] for p in parts)))
    _check_sub_block(min(block), what)
    parts = [regroup(p, block) for p in parts]
    return Fp8BlockWeight(torch.stack([p.qweight for p in parts]), torch.stack([p.scale for p in parts]), block)


def common_grid(weights: list[Fp8BlockWeight], what: str) -> list[Fp8BlockWeight]:
    """Weights one kernel launch reads with one scale block (routed and shared experts): regrouped to the finest."""
    block = (_pow2_gcd(*(w.block[0] for w in weights)), _pow2_gcd(*(w.block[1] for w in weights)))
    _check_sub_block(min(block), what)
    return [regroup(w, block) for w in weights]
