"""The weight-quantization seam: how a projection weight is stored, and what the layers call to multiply by it.

A stored weight is a 16 / 32-bit tensor (`Unquantized`) or a block-FP8 `Fp8BlockWeight` (`Fp8Block`). The loader
decides per tensor (a checkpoint's scale sidecar, or online quantization: fp8_loading.py); the layers take the
method of what was loaded (`method_of`) once, at construction, and call it for their projections (common/
quantization/linear.py) and routed experts (common/layers/moe.py). The budget and the benchmark floor ask
`spec_method` how a declared tensor will be stored, before anything is loaded. Another format (FP8 per-channel,
INT4) is one more QuantMethod and its kernels; the layers do not change."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Union

import torch

from lightllm_mtp.common.quantization import fp8_blocks
from lightllm_mtp.common.tensor_spec import TensorSpec
from lightllm_mtp.config.quant_config import QuantConfig
from lightllm_mtp.kernels.linear.gemv import linear
from lightllm_mtp.kernels.moe.fused_moe import fused_moe, fused_moe_shared
from lightllm_mtp.kernels.quant.fp8_block import Fp8BlockWeight, quantize_fp8_block
from lightllm_mtp.kernels.quant.fp8_linear import fp8_linear
from lightllm_mtp.kernels.moe.fp8_moe import fp8_fused_moe, fp8_fused_moe_shared

StoredWeight = Union[torch.Tensor, Fp8BlockWeight]


class QuantMethod(ABC):
    """One storage format of projection weights: its bytes, random weights, fusion and products."""

    name: str

    @abstractmethod
    def stored_bytes(self, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        """Bytes of a weight of this full (or local) shape, scales included; dtype: the model's."""

    @abstractmethod
    def random(self, shape: tuple[int, ...], dtype: torch.dtype, device, generator, std: float) -> StoredWeight:
        """A random weight of this shape (load_format dummy)."""

    @abstractmethod
    def cat_rows(self, parts: list[StoredWeight], what: str) -> StoredWeight:
        """Parts concatenated along their output rows (fused projections)."""

    @abstractmethod
    def stack(self, parts: list[StoredWeight], what: str) -> StoredWeight:
        """Same-shape parts stacked on a new dim 0 (per-expert tensors)."""

    @abstractmethod
    def linear(self, x: torch.Tensor, weight: StoredWeight) -> torch.Tensor:
        """x [T, K] @ weight [N, K]^T -> [T, N] in x.dtype."""

    def prepare_experts(self, w_gate_up, w_down, shared_gate_up, shared_down) -> tuple[StoredWeight, ...]:
        """The MoE layer's weights as its one-pass kernel reads them (shared expert beside the routed ones)."""
        return w_gate_up, w_down, shared_gate_up, shared_down

    @abstractmethod
    def moe(self, x, w_gate_up, w_down, topk_weights, topk_ids) -> torch.Tensor:
        """Routed experts (kernels/moe/fused_moe.py's contract)."""

    @abstractmethod
    def moe_shared(self, x, w_gate_up, w_down, shared_gate_up, shared_down, topk_weights, topk_ids,
                   alignment=None) -> torch.Tensor:  # fmt: skip
        """Routed experts and the shared expert in one pass (fused_moe_shared's contract)."""


class Unquantized(QuantMethod):
    name = "none"

    def stored_bytes(self, shape, dtype):
        return math.prod(shape) * torch.empty((), dtype=dtype).element_size()

    def random(self, shape, dtype, device, generator, std):
        return torch.empty(shape, device=device, dtype=dtype).normal_(0.0, std, generator=generator)

    def cat_rows(self, parts, what):
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)

    def stack(self, parts, what):
        return torch.stack(parts)

    def linear(self, x, weight):
        return linear(x, weight)

    def moe(self, x, w_gate_up, w_down, topk_weights, topk_ids):
        return fused_moe(x, w_gate_up, w_down, topk_weights, topk_ids)

    def moe_shared(self, x, w_gate_up, w_down, shared_gate_up, shared_down, topk_weights, topk_ids, alignment=None):
        return fused_moe_shared(x, w_gate_up, w_down, shared_gate_up, shared_down, topk_weights, topk_ids,
                                alignment=alignment)  # fmt: skip


class Fp8Block(QuantMethod):
    """e4m3 values, one fp32 scale per block (kernels/quant/)."""

    name = "fp8"

    def __init__(self, block: tuple[int, int]):
        self.block = block

    def stored_bytes(self, shape, dtype):
        *lead, rows, cols = shape
        return math.prod(shape) + 4 * math.prod(lead) * -(-rows // self.block[0]) * -(-cols // self.block[1])

    def random(self, shape, dtype, device, generator, std):
        if len(shape) == 3:  # stacked experts, one at a time: the fp32 draw of a 122B layer's would not fit beside it
            parts = [self.random(shape[1:], dtype, device, generator, std) for _ in range(shape[0])]
            return fp8_blocks.stack(parts, "random experts")
        dense = torch.empty(shape, device=device, dtype=torch.float32).normal_(0.0, std, generator=generator)
        return quantize_fp8_block(dense, self.block)

    def cat_rows(self, parts, what):
        return fp8_blocks.cat_rows(parts, what)

    def stack(self, parts, what):
        return fp8_blocks.stack(parts, what)

    def linear(self, x, weight):
        return fp8_linear(x, weight)

    def prepare_experts(self, w_gate_up, w_down, shared_gate_up, shared_down):
        gate_up, shared_gu = fp8_blocks.common_grid([w_gate_up, shared_gate_up], "experts' gate_up")
        down, shared_d = fp8_blocks.common_grid([w_down, shared_down], "experts' down")
        return gate_up, down, shared_gu, shared_d

    def moe(self, x, w_gate_up, w_down, topk_weights, topk_ids):
        return fp8_fused_moe(x, w_gate_up=w_gate_up, w_down=w_down, topk_weights=topk_weights, topk_ids=topk_ids)

    def moe_shared(self, x, w_gate_up, w_down, shared_gate_up, shared_down, topk_weights, topk_ids, alignment=None):
        return fp8_fused_moe_shared(x, w_gate_up=w_gate_up, w_down=w_down, shared_gate_up=shared_gate_up,
                                    shared_down=shared_down, topk_weights=topk_weights, topk_ids=topk_ids,
                                    alignment=alignment)  # fmt: skip


UNQUANTIZED = Unquantized()


def method_of(weight: StoredWeight) -> QuantMethod:
    """The method of a loaded weight."""
    if isinstance(weight, Fp8BlockWeight):
        return Fp8Block(weight.block)
    if isinstance(weight, torch.Tensor):
        return UNQUANTIZED
    raise TypeError(f"not a stored weight: {type(weight).__name__}")


def common_method(parts: list[StoredWeight], names: list[str]) -> QuantMethod:
    """The one method of weights a layer fuses; weights stored in different formats cannot be fused."""
    methods = [method_of(p) for p in parts]
    if any(m.name != methods[0].name for m in methods):
        shown = ", ".join(f"{n} ({m.name})" for n, m in zip(names, methods))
        raise ValueError(f"these tensors are fused into one projection but stored in different formats: {shown}")
    return methods[0]


def spec_method(spec: TensorSpec, quant: QuantConfig | None) -> QuantMethod:
    """How a declared tensor will be stored when the checkpoint follows the published layout (its projections
    FP8 under a quantization_config or online FP8): what memory budgets, random weights and floors count."""
    if quant is not None and spec.quantizable:
        return Fp8Block(quant.block)
    return UNQUANTIZED


def spec_bytes(spec: TensorSpec, dtype: torch.dtype, quant: QuantConfig | None, tp: int = 1) -> int:
    """Bytes one tp rank stores of a declared tensor (scales included), as spec_method says it will be stored."""
    shape = spec.local_shape(0, tp)
    if spec.keep_fp32:
        return math.prod(shape) * 4
    return spec_method(spec, quant).stored_bytes(shape, dtype)
