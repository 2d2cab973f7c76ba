"""Block-FP8 tensors of a checkpoint, as the loader (common/weight_loader.py) reads them.

The rule of the published -FP8 layout (checked against transformers' FineGrainedFP8 integration, whose quantizer
writes `<name>_scale_inv` next to `<name>` and whose loader pairs them by that name): a tensor is FP8 exactly when it
has a `<name>_scale_inv` sidecar (`x.weight` -> `x.weight_scale_inv`; fused experts `...experts.gate_up_proj` ->
`...experts.gate_up_proj_scale_inv`), of shape [..., ceil(out / bn), ceil(in / bk)] for the config's
weight_block_size [bn, bk], in bf16 or fp32 (both are published), and W = fp8 * scale. Every FP8 tensor the engine
reads consumes exactly its one scale; a scale without its weight, a scale on a tensor the engine reads unquantized,
an FP8 tensor without a scale and a mis-shaped scale each fail the load, named."""

from __future__ import annotations

import torch

from lightllm_mtp.common.quantization import fp8_blocks
from lightllm_mtp.common.tensor_spec import TensorSpec, TpShard
from lightllm_mtp.config.quant_config import SCALE_SUFFIX, QuantConfig
from lightllm_mtp.kernels.quant.fp8_block import FP8_DTYPE, Fp8BlockWeight

SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def sidecar(name: str) -> str:
    return name + SCALE_SUFFIX


def index_errors(where: dict[str, str], quant: QuantConfig | None) -> list[str]:
    """Checkpoint-wide pairing: every scale has its weight, and scales come with a quantization_config."""
    scales = sorted(n for n in where if n.endswith(SCALE_SUFFIX))
    errors = [f"{s}: a scale whose weight {s[: -len(SCALE_SUFFIX)]} is not in the checkpoint"
              for s in scales if s[: -len(SCALE_SUFFIX)] not in where]  # fmt: skip
    if scales and quant is None:
        errors.append(f"{len(scales)} *{SCALE_SUFFIX} scale tensors (e.g. {scales[0]}) but config.json has no "
                      "quantization_config (block-FP8 needs its weight_block_size)")  # fmt: skip
    return errors


def is_fp8(sources: list[str], where: dict[str, str]) -> bool:
    return any(sidecar(s) in where for s in sources)


def source_errors(spec: TensorSpec, sources: list[str], where: dict[str, str]) -> list[str]:
    """Before reading: a scale the engine would leave unconsumed (its tensor is read unquantized), or per-expert
    parts of one fused tensor stored partly in FP8."""
    with_scale = [s for s in sources if sidecar(s) in where]
    if not with_scale:
        return []
    if not spec.quantizable:
        return [f"{s}: has the scale {sidecar(s)}, but this engine reads {s} unquantized (only the projections the "
                "published -FP8 checkpoints quantize may be FP8), so the scale would be left unconsumed"
                for s in with_scale]  # fmt: skip
    if len(with_scale) != len(sources):
        plain = [s for s in sources if s not in with_scale]
        return [f"{spec.name}: its parts are FP8 (e.g. {with_scale[0]}) except {', '.join(plain[:3])}"
                f"{' and more' if len(plain) > 3 else ''}, which have no {SCALE_SUFFIX} scale"]  # fmt: skip
    return []


def check_unscaled(name: str, tensor: torch.Tensor) -> list[str]:
    """A tensor read without a scale must not be FP8."""
    if tensor.dtype == FP8_DTYPE:
        return [f"{name}: stored as float8_e4m3fn but the checkpoint has no scale {sidecar(name)} for it"]
    return []


def assemble(
    spec: TensorSpec, sources: list[str], raw: dict[str, torch.Tensor], full_shape: dict[str, tuple],
    quant: QuantConfig, shard_of, tp_rank: int, tp_size: int,
) -> tuple[Fp8BlockWeight | None, list[str]]:
    """This rank's Fp8BlockWeight of `spec` from its FP8 sources (the spec's own tensor, or its per-expert parts,
    each read as this rank's pieces) and their whole scales in `raw`; or None and the errors. shard_of(spec, src):
    the TpShard a source was read with."""
    errors: list[str] = []
    parts: dict[str, Fp8BlockWeight] = {}
    for src in sources:
        q, scale, full = raw[src], raw[sidecar(src)], full_shape[src]
        want = (*full[:-2], -(-full[-2] // quant.block[0]), -(-full[-1] // quant.block[1]))
        if q.dtype != FP8_DTYPE:
            errors.append(f"{src}: has the scale {sidecar(src)} but is stored as {str(q.dtype).replace('torch.', '')}"
                          ", not float8_e4m3fn")  # fmt: skip
        elif scale.dtype not in SCALE_DTYPES:
            errors.append(f"{sidecar(src)}: scale dtype {str(scale.dtype).replace('torch.', '')} (expected float32 or "
                          "bfloat16)")  # fmt: skip
        elif tuple(scale.shape) != want:
            errors.append(f"{sidecar(src)}: expected shape {want} (one scale per {quant.block[0]}x{quant.block[1]} "
                          f"block of {src} {full}), found {tuple(scale.shape)}")  # fmt: skip
        else:
            shard: TpShard | None = shard_of(spec, src) if tp_size > 1 else None
            pieces = shard.ranges(full[shard.dim], tp_rank, tp_size) if shard is not None else None
            try:
                parts[src] = fp8_blocks.shard_fp8(q, scale, quant.block, shard.dim if shard else None, pieces,
                                                  f"{src} at tp={tp_size}")  # fmt: skip
            except fp8_blocks.Fp8LayoutError as e:
                errors.append(str(e))
    if errors:
        return None, errors
    if spec.name in parts:
        return parts[spec.name], []
    assert spec.stacked_from is not None
    try:
        experts = [fp8_blocks.cat_rows([parts[n] for n in group], spec.name) for group in spec.stacked_from]
        return fp8_blocks.stack(experts, spec.name), []
    except fp8_blocks.Fp8LayoutError as e:
        return None, [str(e)]
