"""Block-FP8 weights: e4m3 values with one fp32 scale per (block_n x block_k) block, W = q * scale (the published
checkpoints' `weight_scale_inv`, a multiplier despite its name). The container every FP8 kernel takes, and the
PyTorch references of quantizing (load-time online FP8, tools/quantize_fp8.py) and dequantizing.

A stored weight may carry blocks smaller than the checkpoint's 128 x 128: a tensor-parallel shard or a fused
projection whose pieces start inside a checkpoint block is regrouped at load into sub-blocks whose scale is their
checkpoint block's (common/quantization/fp8_blocks.py); the kernels take any power-of-two block >= MIN_BLOCK."""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
MIN_BLOCK = 32  # the smallest block side the kernels take: the w8a8 K step is one block, an e4m3 tl.dot needs K >= 32


@dataclass(frozen=True)
class Fp8BlockWeight:
    """qweight [..., N, K] float8_e4m3fn; scale [..., ceil(N / block_n), ceil(K / block_k)] float32."""

    qweight: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int]

    def __post_init__(self) -> None:
        q, s = self.qweight, self.scale
        if q.dtype != FP8_DTYPE:
            raise ValueError(f"Fp8BlockWeight: qweight must be float8_e4m3fn, got {q.dtype}")
        if s.dtype != torch.float32:
            raise ValueError(f"Fp8BlockWeight: scale must be float32, got {s.dtype}")
        bn, bk = self.block
        if any(b < MIN_BLOCK or b & (b - 1) for b in self.block):
            raise ValueError(f"Fp8BlockWeight: block {self.block} must be powers of two >= {MIN_BLOCK}")
        want = (*q.shape[:-2], -(-q.shape[-2] // bn), -(-q.shape[-1] // bk))
        if q.ndim < 2 or tuple(s.shape) != want:
            raise ValueError(f"Fp8BlockWeight: scale shape {list(s.shape)} does not fit qweight {list(q.shape)} at "
                             f"block {self.block} (expected {list(want)})")  # fmt: skip
        if q.device != s.device:
            raise ValueError(f"Fp8BlockWeight: qweight on {q.device}, scale on {s.device}")

    @property
    def shape(self) -> torch.Size:
        return self.qweight.shape

    @property
    def ndim(self) -> int:
        return self.qweight.ndim

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() * self.qweight.element_size() + self.scale.numel() * self.scale.element_size()

    def __getitem__(self, index: int) -> "Fp8BlockWeight":
        """One expert of a stacked [E, N, K] weight."""
        if self.ndim < 3:
            raise IndexError("Fp8BlockWeight: only stacked (3-D) weights are indexed")
        return Fp8BlockWeight(self.qweight[index], self.scale[index], self.block)

    def to(self, device: torch.device | str) -> "Fp8BlockWeight":
        return Fp8BlockWeight(self.qweight.to(device), self.scale.to(device), self.block)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_fp8_block(self.qweight, self.scale, self.block, dtype)


def expand_block_scale(scale: torch.Tensor, block: tuple[int, int], rows: int, cols: int) -> torch.Tensor:
    """[..., rows, cols] fp32: each element's scale."""
    bn, bk = block
    return scale.float().repeat_interleave(bn, dim=-2)[..., :rows, :].repeat_interleave(bk, dim=-1)[..., :cols]


def dequantize_fp8_block(qweight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:  # fmt: skip
    """W = q * scale, in fp32 (exact: an e4m3 value times an fp32 scale), then rounded to dtype."""
    rows, cols = qweight.shape[-2:]
    return (qweight.float() * expand_block_scale(scale, block, rows, cols)).to(dtype)


def quantize_fp8_block(weight: torch.Tensor, block: tuple[int, int],
                       scale_dtype: torch.dtype = torch.float32) -> Fp8BlockWeight:  # fmt: skip
    """Per block: scale = amax / 448 (1 for an all-zero block), q = round-to-nearest-e4m3(w / scale); the largest
    magnitude of every nonzero block lands on +-448, as in the published checkpoints. Works on any device; blocks at
    the edges are partial (the scale covers what is there). scale_dtype: the scales are rounded to it first (a
    checkpoint storing bf16 scales), so that q * scale holds with the stored scale."""
    if weight.ndim < 2:
        raise ValueError(f"quantize_fp8_block: a weight [..., N, K] is needed, got shape {list(weight.shape)}")
    bn, bk = block
    *lead, rows, cols = weight.shape
    nb_r, nb_c = -(-rows // bn), -(-cols // bk)
    w = weight.float()
    if rows % bn or cols % bk:
        w = torch.nn.functional.pad(w, (0, nb_c * bk - cols, 0, nb_r * bn - rows))
    tiles = w.reshape(*lead, nb_r, bn, nb_c, bk)
    amax = tiles.abs().amax(dim=(-3, -1))  # [..., nb_r, nb_c]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax)).to(scale_dtype).float()
    q = (tiles / scale[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    q = q.reshape(*lead, nb_r * bn, nb_c * bk)[..., :rows, :cols].contiguous()
    return Fp8BlockWeight(q, scale.contiguous(), (bn, bk))
