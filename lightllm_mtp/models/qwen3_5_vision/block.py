"""One vision transformer block: pre-LayerNorm (with bias) attention over each frame's patches with the 2D rotary
embedding, then a pre-LayerNorm MLP (linear_fc1, GELU, linear_fc2, all with bias)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lightllm_mtp.common.tensor_spec import TensorSpec
from lightllm_mtp.config.vision_config import VisionConfig

LAYER_NORM_EPS = 1e-6


def layer_norm_specs(prefix: str, size: int) -> list[TensorSpec]:
    return [TensorSpec(f"{prefix}.weight", (size,)), TensorSpec(f"{prefix}.bias", (size,))]


def linear_specs(prefix: str, out_features: int, in_features: int) -> list[TensorSpec]:
    return [TensorSpec(f"{prefix}.weight", (out_features, in_features)), TensorSpec(f"{prefix}.bias", (out_features,))]


def activation(name: str):
    if name == "gelu_pytorch_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    raise ValueError(f"vision activation {name!r} is not supported")


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, head_dim] rotated by the per-patch angles (cos / sin [N, head_dim] fp32; the two halves of
    head_dim are the rotation pairs), in fp32, returned in x's dtype."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated_half = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, None] + rotated_half * sin[:, None]).to(x.dtype)


@dataclass(frozen=True)
class SegmentBatch:
    """Attention segments of one length, run as one batched call: `count` segments of `length` rows each."""

    rows: slice | torch.Tensor  # their rows of the [N, ...] inputs, segment after segment (an index when apart)
    count: int
    length: int


def segment_batches(segments: tuple[tuple[int, int], ...], device: torch.device) -> list[SegmentBatch]:
    """(start, length) segments grouped by length, once per forward."""
    by_length: dict[int, list[int]] = {}
    for start, length in segments:
        by_length.setdefault(length, []).append(start)
    batches = []
    for length, starts in by_length.items():
        first, count = starts[0], len(starts)
        if starts == list(range(first, first + length * count, length)):
            rows: slice | torch.Tensor = slice(first, first + length * count)
        else:
            rows = (torch.tensor(starts)[:, None] + torch.arange(length)).flatten().to(device, non_blocking=True)
        batches.append(SegmentBatch(rows, count, length))
    return batches


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batches: list[SegmentBatch]) -> torch.Tensor:
    """Bidirectional attention within each segment: q, k, v [N, heads, head_dim] -> [N, heads * head_dim]."""
    n, heads, dim = q.shape
    out = torch.empty(n, heads * dim, dtype=q.dtype, device=q.device)
    for b in batches:
        o = F.scaled_dot_product_attention(_batched(q, b), _batched(k, b), _batched(v, b))
        out[b.rows] = o.transpose(1, 2).reshape(b.count * b.length, heads * dim)
    return out


def _batched(x: torch.Tensor, b: SegmentBatch) -> torch.Tensor:
    """[N, heads, dim] -> the batch's [count, heads, length, dim]."""
    return x[b.rows].view(b.count, b.length, *x.shape[1:]).transpose(1, 2)


class VisionBlock:
    def __init__(self, cfg: VisionConfig, weights: dict[str, torch.Tensor], prefix: str):
        self.cfg = cfg
        self.norm1 = (weights[f"{prefix}norm1.weight"], weights[f"{prefix}norm1.bias"])
        self.norm2 = (weights[f"{prefix}norm2.weight"], weights[f"{prefix}norm2.bias"])
        self.qkv = (weights[f"{prefix}attn.qkv.weight"], weights[f"{prefix}attn.qkv.bias"])
        self.proj = (weights[f"{prefix}attn.proj.weight"], weights[f"{prefix}attn.proj.bias"])
        self.fc1 = (weights[f"{prefix}mlp.linear_fc1.weight"], weights[f"{prefix}mlp.linear_fc1.bias"])
        self.fc2 = (weights[f"{prefix}mlp.linear_fc2.weight"], weights[f"{prefix}mlp.linear_fc2.bias"])
        self.act = activation(cfg.hidden_act)

    @staticmethod
    def specs(cfg: VisionConfig, prefix: str) -> list[TensorSpec]:
        d, inter = cfg.hidden_size, cfg.intermediate_size
        return (layer_norm_specs(f"{prefix}norm1", d) + layer_norm_specs(f"{prefix}norm2", d)
                + linear_specs(f"{prefix}attn.qkv", 3 * d, d) + linear_specs(f"{prefix}attn.proj", d, d)
                + linear_specs(f"{prefix}mlp.linear_fc1", inter, d)
                + linear_specs(f"{prefix}mlp.linear_fc2", d, inter))  # fmt: skip

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batches: list[SegmentBatch]):
        """x [N, hidden] -> [N, hidden]; cos / sin [N, head_dim] fp32."""
        d, heads = self.cfg.hidden_size, self.cfg.num_heads
        h = F.layer_norm(x, (d,), *self.norm1, eps=LAYER_NORM_EPS)
        q, k, v = F.linear(h, *self.qkv).view(-1, 3, heads, d // heads).unbind(1)
        attn = segment_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, batches)
        x = x + F.linear(attn, *self.proj)
        h = F.layer_norm(x, (d,), *self.norm2, eps=LAYER_NORM_EPS)
        return x + F.linear(self.act(F.linear(h, *self.fc1)), *self.fc2)
