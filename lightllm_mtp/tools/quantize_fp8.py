"""Write a checkpoint in the published -FP8 layout from a 16 / 32-bit Qwen3.5 checkpoint.

    python -m lightllm_mtp.tools.quantize_fp8 --model_dir IN --out OUT [--scale_dtype bfloat16|float32] [--block 128]

Quantized (128 x 128 blocks, e4m3, W = fp8 * weight_scale_inv): exactly the tensors the engine declares quantizable
(common/tensor_spec.py `quantizable`), i.e. what Qwen's -FP8 checkpoints quantize: attention q/k/v/o, GDN
in_proj_qkv / in_proj_z / out_proj, MLP and shared-expert gate/up/down, the routed experts (fused 3-D tensors get a
[E, rows, cols] scale, per-expert ones one each), and the same in every MTP module. Everything else (embeddings,
lm_head, norms, conv1d, A_log, dt_bias, in_proj_a / b, the router and shared_expert_gate, mtp.fc, the vision tower)
is copied as it is. Each scale is written to its weight's shard; config.json gains the quantization_config; the
other files (tokenizer, generation config, ...) are copied. Used to build the tests' FP8 fixtures at test time."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lightllm_mtp.common.weight_loader import shard_index
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.config.quant_config import FP8_BLOCK, SCALE_SUFFIX, QuantConfig
from lightllm_mtp.kernels.quant.fp8_block import quantize_fp8_block
from lightllm_mtp.models.registry import model_class, mtp_model_class

_NOT_COPIED = ("config.json", "model.safetensors.index.json", "acceptance", "train_log")
SCALE_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def quantizable_names(cfg: ModelConfig, where: dict[str, str]) -> set[str]:
    """Checkpoint names of the quantizable tensors of the main model and every MTP module, as this checkpoint stores
    them (a fused expert tensor, or its per-expert parts)."""
    specs = list(model_class(cfg).weight_specs(cfg))
    mtp = mtp_model_class(cfg)
    for j in range(cfg.mtp_num_hidden_layers):
        specs += mtp.weight_specs(cfg, j)
    names, missing = set(), []
    for spec in specs:
        if not spec.quantizable:
            continue
        parts = [n for group in spec.stacked_from or () for n in group]
        if spec.name in where:
            names.add(spec.name)
        elif parts and all(n in where for n in parts):
            names.update(parts)
        else:
            missing.append(spec.name)
    if missing:
        raise SystemExit(f"quantizable tensors not in the checkpoint: {', '.join(missing[:5])}")
    return names


def quantize_checkpoint(model_dir: str | Path, out: str | Path, scale_dtype: torch.dtype = torch.bfloat16,
                        block: tuple[int, int] = FP8_BLOCK) -> Path:  # fmt: skip
    """Writes OUT; returns it. OUT must not exist yet (or be empty)."""
    src, dst = Path(model_dir), Path(out)
    hf = json.loads((src / "config.json").read_text())
    cfg = ModelConfig.from_hf(hf)
    if cfg.quantization is not None:
        raise SystemExit(f"{src}: already quantized (quantization_config {hf.get('quantization_config')})")
    if dst.exists() and any(dst.iterdir()):
        raise SystemExit(f"{dst}: exists and is not empty")
    dst.mkdir(parents=True, exist_ok=True)
    where = shard_index(src)
    wanted = quantizable_names(cfg, where)
    weight_map: dict[str, str] = {}
    kept: set[str] = set()
    total = 0
    for shard in sorted(set(where.values())):
        tensors = load_file(str(src / shard))
        written: dict[str, torch.Tensor] = {}
        for name, t in tensors.items():
            if name in wanted:
                q = quantize_fp8_block(t.float(), block, scale_dtype)
                written[name], written[name + SCALE_SUFFIX] = q.qweight, q.scale.to(scale_dtype).contiguous()
            else:
                written[name] = t
                if t.ndim >= 2 and name.endswith(".weight"):
                    kept.add(name[: -len(".weight")])
        save_file(written, str(dst / shard), metadata={"format": "pt"})
        for name, t in written.items():
            weight_map[name] = shard
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    hf["quantization_config"] = QuantConfig(block=block, modules_to_not_convert=tuple(sorted(kept))).to_hf()
    (dst / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    for f in src.iterdir():  # tokenizer, generation config, chat template (not the source's own measurements)
        if f.is_file() and f.suffix != ".safetensors" and not f.name.startswith(_NOT_COPIED):
            shutil.copy2(f, dst / f.name)
    return dst


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model_dir", required=True, help="the 16 / 32-bit checkpoint")
    p.add_argument("--out", required=True, help="where the FP8 checkpoint is written (a new directory)")
    p.add_argument("--scale_dtype", choices=sorted(SCALE_DTYPES), default="bfloat16",
                   help="dtype of the weight_scale_inv tensors (Qwen3.5 -FP8: bfloat16; Qwen3-Next -FP8: float32)")
    p.add_argument("--block", type=int, default=FP8_BLOCK[0], help="square block side (published: 128)")
    args = p.parse_args(argv)
    out = quantize_checkpoint(args.model_dir, args.out, SCALE_DTYPES[args.scale_dtype], (args.block, args.block))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
