"""Random weights for a declared model (benchmarks at real shapes without a checkpoint).

Tensors are made directly on the target device in the target dtype, from the same TensorSpecs the loader
reads, so a random model has exactly the layout and byte count of the real one."""

from __future__ import annotations

import torch

from lightllm_mtp.common.tensor_spec import TensorSpec


def random_tensors(
    specs: list[TensorSpec], dtype: torch.dtype, device: torch.device | str, seed: int = 0, std: float = 0.02
) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for spec in specs:
        target = torch.float32 if spec.keep_fp32 else dtype
        name = spec.name
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
