"""One vision transformer block: pre-LayerNorm (with bias) attention over each frame's patches with the 2D rotary
embedding, then a pre-LayerNorm MLP (linear_fc1, GELU, linear_fc2, all with bias)."""

from __future__ import annotations

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


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      segments: tuple[tuple[int, int], ...]) -> torch.Tensor:  # fmt: skip
    """Bidirectional attention within each segment: q, k, v [N, heads, head_dim] -> [N, heads * head_dim].
    Segments of equal length run as one batched call (the rows gathered when they are not adjacent)."""
    n, heads, dim = q.shape
    out = torch.empty(n, heads * dim, dtype=q.dtype, device=q.device)
    by_length: dict[int, list[int]] = {}
    for start, length in segments:
        by_length.setdefault(length, []).append(start)
    for length, starts in by_length.items():
        first = starts[0]
        adjacent = starts == list(range(first, first + length * len(starts), length))
        if adjacent:
            rows = slice(first, first + length * len(starts))
        else:
            rows = (torch.tensor(starts)[:, None] + torch.arange(length)).flatten().to(q.device)

        def batch(x):  # [B * L, heads, dim] -> [B, heads, L, dim]
            return x[rows].view(len(starts), length, heads, dim).transpose(1, 2)

        o = F.scaled_dot_product_attention(batch(q), batch(k), batch(v))
        out[rows] = o.transpose(1, 2).reshape(len(starts) * length, heads * dim)
    return out


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

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                segments: tuple[tuple[int, int], ...]) -> torch.Tensor:  # fmt: skip
        """x [N, hidden] -> [N, hidden]."""
        d, heads = self.cfg.hidden_size, self.cfg.num_heads
        h = F.layer_norm(x, (d,), *self.norm1, eps=LAYER_NORM_EPS)
        q, k, v = F.linear(h, *self.qkv).view(-1, 3, heads, d // heads).unbind(1)
        attn = segment_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, segments)
        x = x + F.linear(attn, *self.proj)
        h = F.layer_norm(x, (d,), *self.norm2, eps=LAYER_NORM_EPS)
        return x + F.linear(self.act(F.linear(h, *self.fc1)), *self.fc2)
