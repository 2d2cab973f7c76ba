"""Random weights for a declared model (benchmarks at real shapes without a checkpoint).

Tensors are made directly on the target device in the target dtype, from the same TensorSpecs the loader
reads, so a random model has exactly the layout and byte count of the real one."""

from __future__ import annotations

import torch

from lightllm_mtp.common.quantization.methods import StoredWeight, spec_method
from lightllm_mtp.common.tensor_spec import TensorSpec
from lightllm_mtp.config.quant_config import QuantConfig


def random_tensors(
    specs: list[TensorSpec], dtype: torch.dtype, device: torch.device | str, seed: int = 0, std: float = 0.02,
    quant: QuantConfig | None = None,
) -> dict[str, StoredWeight]:
    """quant: the quantizable specs are made in that format (block-FP8: the bytes of an -FP8 checkpoint)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out: dict[str, StoredWeight] = {}
    for spec in specs:
        target = torch.float32 if spec.keep_fp32 else dtype
        name = spec.name
        method = spec_method(spec, quant)
        if method.name != "none":
            out[name] = method.random(spec.shape, target, device, gen, std)
            continue
        if name.endswith("A_log"):
            t = torch.empty(spec.shape, device=device, dtype=torch.float32).uniform_(0.0, 1.0, generator=gen)
        elif name.endswith("dt_bias") or (len(spec.shape) == 1 and name.endswith("norm.weight")):
            t = torch.randn(spec.shape, device=device, dtype=torch.float32, generator=gen) * 0.1
            if name.endswith("linear_attn.norm.weight"):
                t += 1.0  # the gated norm uses a plain weight
        else:
            t = torch.empty(spec.shape, device=device, dtype=target).normal_(0.0, std, generator=gen)
        out[name] = t.to(target)
    return out
