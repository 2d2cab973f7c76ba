"""The one weight loader: model packages declare TensorSpecs, this reads them from safetensors shards.

Handles `model.safetensors.index.json` sharding or a single `model.safetensors`, casts to the model dtype,
checks every shape, and reports all missing or mis-shaped tensors by name in one error. Block-FP8 tensors (those with
a `_scale_inv` sidecar) load as Fp8BlockWeight with their scales (common/quantization/fp8_loading.py); with online
FP8 the quantizable 16 / 32-bit ones are quantized on the device as they arrive.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from lightllm_mtp.common.quantization import fp8_loading
from lightllm_mtp.common.quantization.methods import StoredWeight
from lightllm_mtp.common.random_weights import random_tensors
from lightllm_mtp.common.tensor_spec import TensorSpec, TpShard
from lightllm_mtp.config.quant_config import QuantConfig
from lightllm_mtp.config.runtime import LoadFormat
from lightllm_mtp.kernels.quant.fp8_block import quantize_fp8_block
from lightllm_mtp.env import ENV


class WeightLoadError(ValueError):
    """The checkpoint lacks declared tensors or has them in the wrong shape."""


def shard_index(model_dir: Path) -> dict[str, str]:
    """tensor name -> shard file name."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise WeightLoadError(f"{index}: not a safetensors index with a weight_map ({type(e).__name__}: {e})")
        return dict(weight_map)
    single = model_dir / "model.safetensors"
    if single.is_file():
        with _open_shard(single) as f:
            return {name: single.name for name in f.keys()}
    raise WeightLoadError(f"{model_dir}: no model.safetensors.index.json or model.safetensors")


class _open_shard:
    """safe_open that names the file when it is truncated, garbage or unreadable."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        try:
            self.handle = safe_open(str(self.path), framework="pt")
            return self.handle.__enter__()
        except Exception as e:  # SafetensorError, OSError: what safetensors raises names no file
            raise WeightLoadError(f"{self.path}: cannot read this safetensors file ({type(e).__name__}: {e})") from e

    def __exit__(self, *exc):
        return self.handle.__exit__(*exc)


def load_tensors(
    model_dir: str | Path, specs: list[TensorSpec], dtype: torch.dtype, device: torch.device | str,
    tp_rank: int = 0, tp_size: int = 1, quant: QuantConfig | None = None, online: QuantConfig | None = None,
) -> dict[str, StoredWeight]:
    """Load every spec; returns spec.name -> tensor (or Fp8BlockWeight) on `device`. With tp_size > 1 a spec with a
    TpShard is read as this rank's slices only (safetensors slices: the rest of the tensor is never read; FP8 scales
    are read whole and cut to the slices' blocks). quant: the checkpoint's quantization_config; online: quantize the
    quantizable tensors the checkpoint stores unquantized (the `quantization fp8` option)."""
    model_dir = Path(model_dir)
    where = shard_index(model_dir)
    wanted: dict[str, list[tuple[str, TpShard | None]]] = defaultdict(list)  # shard file -> (name, tp slicing)
    missing: list[str] = []
    fp8_errors = fp8_loading.index_errors(where, quant)
    sources_of: dict[str, list[str]] = {}
    for spec in specs:
        sources = _sources(spec, where)
        if sources is None:
            missing.append(_describe_missing(spec, where))
            continue
        sources_of[spec.name] = sources
        fp8_errors += fp8_loading.source_errors(spec, sources, where)
        for src in sources:
            wanted[where[src]].append((src, _source_shard(spec, src) if tp_size > 1 else None))
            if fp8_loading.sidecar(src) in where:
                wanted[where[fp8_loading.sidecar(src)]].append((fp8_loading.sidecar(src), None))
    if missing:
        raise WeightLoadError(f"{model_dir}: missing tensors: {', '.join(missing)}")
    if fp8_errors:
        raise WeightLoadError(f"{model_dir}: FP8 scales: " + "; ".join(fp8_errors))

    raw: dict[str, torch.Tensor] = {}
    full_shape: dict[str, tuple[int, ...]] = {}  # checkpoint shapes (raw holds this rank's slices)
    total = sum(len(v) for v in wanted.values())
    with tqdm(total=total, desc="loading weights", unit="tensor", disable=ENV.disable_progress_bars) as bar:
        for shard, shard_specs in sorted(wanted.items()):
            path = model_dir / shard
            if not path.is_file():
                raise WeightLoadError(f"{path}: shard named by the index not found")
            with _open_shard(path) as f:
                for name, shard in shard_specs:
                    try:
                        raw[name], full_shape[name] = _read(f, name, shard, tp_rank, tp_size)
                    except Exception as e:  # a header that promises more bytes than the file holds
                        raise WeightLoadError(f"{path}: cannot read tensor {name} ({type(e).__name__}: {e})") from e
                    bar.update(1)

    out: dict[str, StoredWeight] = {}
    errors: list[str] = []
    for spec in specs:
        if spec.name not in raw:
            bad = _misshaped_parts(spec, full_shape)
            if bad:
                errors += bad
                continue
        elif full_shape[spec.name] != tuple(spec.shape):
            errors.append(f"{spec.name}: expected shape {tuple(spec.shape)}, found {full_shape[spec.name]}")
            continue
        sources = sources_of[spec.name]
        if fp8_loading.is_fp8(sources, where):
            weight, bad = fp8_loading.assemble(spec, sources, raw, full_shape, quant, _source_shard, tp_rank, tp_size)
            errors += bad
            if weight is not None:
                out[spec.name] = weight.to(device)
            continue
        unscaled = [e for src in sources for e in fp8_loading.check_unscaled(src, raw[src])]
        if unscaled:
            errors += unscaled
            continue
        tensor = raw[spec.name] if spec.name in raw else _stack(spec, raw)
        local = spec.local_shape(tp_rank, tp_size)
        if tensor.shape[spec.tp.dim if spec.tp else 0] < local[spec.tp.dim if spec.tp else 0]:  # padded vocab rows
            tensor = _pad(tensor, spec.tp.dim, local[spec.tp.dim])
        assert tuple(tensor.shape) == local, (spec.name, tuple(tensor.shape), local)
        target = torch.float32 if spec.keep_fp32 else dtype
        out[spec.name] = tensor.to(device=device, dtype=target).contiguous()
        if online is not None and spec.quantizable:
            out[spec.name] = quantize_fp8_block(out[spec.name], online.block)
    if errors:
        raise WeightLoadError(f"{model_dir}: mis-shaped or wrongly stored tensors: " + "; ".join(errors))
    return out


def _sources(spec: TensorSpec, where: dict[str, str]) -> list[str] | None:
    if spec.name in where:
        return [spec.name]
    if spec.stacked_from is not None:
        names = [n for group in spec.stacked_from for n in group]
        if all(n in where for n in names):
            return names
    return None


def _describe_missing(spec: TensorSpec, where: dict[str, str]) -> str:
    """The spec's name, and where the checkpoint holds some of its per-expert parts, the parts it lacks."""
    if spec.stacked_from is None:
        return spec.name
    names = [n for group in spec.stacked_from for n in group]
    absent = [n for n in names if n not in where]
    if len(absent) == len(names):
        return spec.name
    shown = ", ".join(absent[:4]) + (f" and {len(absent) - 4} more" if len(absent) > 4 else "")
    return f"{spec.name} (per-expert parts missing: {shown})"


def _misshaped_parts(spec: TensorSpec, full_shape: dict[str, tuple[int, ...]]) -> list[str]:
    """Per-expert parts whose shape does not fit the fused spec: each of a group's n parts holds 1/n of its rows."""
    assert spec.stacked_from is not None
    errors = []
    for group in spec.stacked_from:
        expected = (spec.shape[1] // len(group), *spec.shape[2:])
        for name in group:
            if full_shape[name] != expected:
                errors.append(f"{name}: expected shape {expected}, found {full_shape[name]}")
    return errors


def _source_shard(spec: TensorSpec, src: str) -> TpShard | None:
    """The slicing of one source tensor: the spec's own, or for a per-expert part (one dim less, one section of
    the fused tensor's) the same dim of the part, split whole."""
    if spec.tp is None or src == spec.name:
        return spec.tp
    assert spec.tp.dim >= 1 and not spec.tp.pad, spec.name
    return TpShard(spec.tp.dim - 1)


def _read(f, name: str, shard: TpShard | None, rank: int, size: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    """(this rank's slices concatenated, the checkpoint's full shape)."""
    if shard is None:
        tensor = f.get_tensor(name)
        return tensor, tuple(tensor.shape)
    part = f.get_slice(name)
    full = tuple(part.get_shape())
    if shard.dim >= len(full):
        return f.get_tensor(name), full  # mis-shaped: reported by the shape check
    lead = (slice(None),) * shard.dim
    pieces = [part[lead + (slice(a, b),)] for a, b in shard.ranges(full[shard.dim], rank, size)]
    return torch.cat(pieces, dim=shard.dim), full


def _pad(tensor: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    shape = list(tensor.shape)
    shape[dim] = size - shape[dim]
    return torch.cat([tensor, tensor.new_zeros(shape)], dim=dim)


def _stack(spec: TensorSpec, raw: dict[str, torch.Tensor]) -> torch.Tensor:
    assert spec.stacked_from is not None
    return torch.stack([torch.cat([raw[n] for n in group], dim=0) for group in spec.stacked_from])


def load_weights(
    model_dir: str | Path, specs: list[TensorSpec], dtype: torch.dtype, device, load_format: LoadFormat, seed: int = 0,
    tp_rank: int = 0, tp_size: int = 1, quant: QuantConfig | None = None, online: QuantConfig | None = None,
) -> dict[str, StoredWeight]:
    """The loading entry point of models and drafts: checkpoint tensors (this tp rank's shard), or random ones of the
    local shapes for LoadFormat.DUMMY (the quantizable ones in FP8 under `quant` or `online`: the published layout)."""
    if load_format is LoadFormat.DUMMY:
        local = [dataclasses.replace(s, shape=s.local_shape(tp_rank, tp_size), tp=None) for s in specs]
        return random_tensors(local, dtype, device, seed + 1000 * tp_rank, quant=quant or online)
    return load_tensors(model_dir, specs, dtype, device, tp_rank, tp_size, quant, online)
