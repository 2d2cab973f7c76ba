"""Where a benchmark's model comes from: a checkpoint directory, or a named published shape with random weights
made on the device; and the LLMEngine built on it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmark.model_shapes import MODEL_SHAPES
from lightllm_mtp.common.random_weights import random_tensors
from lightllm_mtp.common.weight_loader import load_tensors
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.engine.step import kv_lookahead_slots
from lightllm_mtp.models.registry import model_class


@dataclass
class ModelSource:
    name: str
    hf_config: dict
    model_dir: str | None  # a checkpoint, or None for random weights at a named shape
    seed: int

    @property
    def cfg(self) -> ModelConfig:
        return ModelConfig.from_hf(self.hf_config)

    def weights(self, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
        """Checkpoint-named main-model tensors; random ones are made on the device and are the same each call."""
        cfg = self.cfg
        specs = model_class(cfg).weight_specs(cfg)
        if self.model_dir is None:  # the engine's load_format="dummy" weights (FP8 under a quantization_config)
            return random_tensors(specs, dtype, device, seed=0, quant=cfg.quantization)
        return load_tensors(self.model_dir, specs, dtype, device, quant=cfg.quantization)


def add_source_args(p: argparse.ArgumentParser, shape_required: bool = False) -> None:
    """--model_shape / --model_dir / --device / --dtype, as resolve_source and engine_settings read them."""
    p.add_argument("--model_shape", required=shape_required, default=None)
    p.add_argument("--model_dir", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto")


def resolve_source(args) -> ModelSource:
    if args.model_dir:
        path = Path(args.model_dir)
        hf = json.loads((path / "config.json").read_text())
        return ModelSource(path.resolve().name, hf, str(path), args.seed)
    hf = json.loads(json.dumps(MODEL_SHAPES[args.model_shape]))
    if getattr(args, "mtp_layers", None):  # multi-layer MTP at a published shape: more (random) MTP modules
        hf["mtp_num_hidden_layers"] = args.mtp_layers
    return ModelSource(args.model_shape, hf, None, args.seed)


def engine_settings(args, max_batch_size: int, **fields) -> argparse.Namespace:
    """What resolve_source / build_engine read, from a benchmark's parsed --model_shape, --model_dir, --seed,
    --device, --dtype; fields: the rest (chunked_prefill_size and graph_max_batch_size default to None: the
    engine's own; mtp_mode / mtp_step / mtp_layers / engine_extra as build_engine reads them)."""
    base = dict(model_dir=getattr(args, "model_dir", None), model_shape=args.model_shape, seed=args.seed,
                device=args.device, dtype=args.dtype, batch_sizes=[max_batch_size], chunked_prefill_size=None,
                graph_max_batch_size=None)  # fmt: skip
    return argparse.Namespace(**{**base, **fields})


def engine_field_names() -> set[str]:
    return {f.name for f in dataclasses.fields(EngineArgs)}


def kv_pool_tokens(max_batch_size: int, max_model_len: int, num_draft_tokens: int) -> int:
    """KV token slots that admit max_batch_size requests at once: the scheduler reserves for each request its tokens
    up to max_model_len plus the runner's lookahead slots (Scheduler.kv_need; kv_lookahead_slots: 1 for plain decoding,
    3 verify blocks of k + 1 rows under MTP)."""
    return max_batch_size * (max_model_len + kv_lookahead_slots(num_draft_tokens))


def build_engine(source: ModelSource, args, max_model_len: int, mtp: bool) -> LLMEngine:
    """The engine for args.batch_sizes: its largest batch admitted whole (request slots and KV pool), unless
    engine_extra overrides max_total_token_num."""
    fields = engine_field_names()
    max_bs = max(args.batch_sizes)
    kw = dict(
        device=args.device,
        dtype=args.dtype,
        max_model_len=max_model_len,
        max_batch_size=max_bs,
        max_total_token_num=kv_pool_tokens(max_bs, max_model_len, args.mtp_step if mtp else 0),
    )
    if args.chunked_prefill_size is not None:
        kw["chunked_prefill_size"] = args.chunked_prefill_size
    if args.graph_max_batch_size is not None:
        if "graph_max_batch_size" not in fields:
            raise SystemExit("--graph_max_batch_size: this engine's EngineArgs has no graph_max_batch_size")
        kw["graph_max_batch_size"] = args.graph_max_batch_size
    if getattr(args, "disable_overlap", False):
        kw["disable_overlap"] = True
    for name, default in (("quantization", "none"), ("kv_cache_dtype", "auto")):  # FP8 weights / KV (issue 31)
        if getattr(args, name, default) != default:
            kw[name] = getattr(args, name)
    if getattr(args, "tp", 1) > 1 or getattr(args, "pp", 1) > 1:
        kw.update(tp=args.tp, pp=args.pp)
    if mtp:
        kw.update(mtp_mode=args.mtp_mode, mtp_step=args.mtp_step)
        if getattr(args, "parallel_drafting", False):
            kw["parallel_drafting"] = True
        if getattr(args, "mtp_adaptive", False):
            kw["mtp_adaptive"] = True
        if getattr(args, "mtp_force_acceptance", None):  # benchmarks: drafts accepted unchecked at this rate
            kw["mtp_force_acceptance"] = args.mtp_force_acceptance
        if getattr(args, "mtp_draft_model_dir", None):  # mtp_mode draft_model: the draft checkpoint (or shape)
            kw["mtp_draft_model_dir"] = args.mtp_draft_model_dir
            if getattr(args, "parallel_drafting", False):
                kw["mtp_mask_token_id"] = getattr(args, "mtp_mask_token_id", None)
        if getattr(args, "mtp_draft_vocab_file", None):
            kw.update(mtp_draft_vocab_file=args.mtp_draft_vocab_file, mtp_draft_vocab_size=args.mtp_draft_vocab_size)
    if "prefix_cache" in fields:  # step timings on random prompts: no cache unless asked (prefix_cache_ttft.py)
        kw["prefix_cache"] = False
    kw.update(getattr(args, "engine_extra", {}))  # further EngineArgs fields (e.g. the prefix cache's)
    if source.model_dir is not None:
        return LLMEngine(EngineArgs(model_dir=source.model_dir, **kw))
    with tempfile.TemporaryDirectory(prefix="lightllm_mtp_shape_") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(source.hf_config))
        return LLMEngine(EngineArgs(model_dir=tmp, load_format="dummy", **kw))
