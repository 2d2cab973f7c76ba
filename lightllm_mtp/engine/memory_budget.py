"""`mem_fraction` (vLLM's gpu_memory_utilization): the KV + snapshot budget that keeps one process within a fraction
of its GPU's memory. It is sized before the model is built (the pools are allocated with the model), from what the
rest will take: the weights this rank loads (its tensor specs; the vision tower's where images are served), the
request slots' GDN state, and a reserve for activations, logits, CUDA graph pools and the allocator's slack."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightllm_mtp.common.quantization.methods import spec_bytes
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.config.spec_config import MtpMode
from lightllm_mtp.models.qwen3_5_vision.tower import VisionTower
from lightllm_mtp.models.registry import model_class

FIXED_RESERVE_BYTES = 2 * 2**30  # CUDA context leftovers, graph pools, fla / Triton workspaces, fragmentation
ACTIVATION_ROWS_FACTOR = 24  # live activation elements per prefill row, in hidden-size units (measured peak ~16)


@dataclass(frozen=True)
class MemoryPlan:
    """What one GPU holds, in bytes; `cache_bytes` is what is left for the KV pool and the snapshots."""

    usable: int  # total x mem_fraction, less what other processes already use
    weights: int
    request_state: int
    reserve: int

    @property
    def cache_bytes(self) -> int:
        return self.usable - self.weights - self.request_state - self.reserve


def rank_share(cfg: ModelConfig, args: EngineArgs) -> float:
    """One rank's share of the model-wide KV / snapshot bytes: its stage's layers, its tp share of the heads (heads
    fewer than ranks are replicated, so no less than one head's worth)."""
    tp, pp = args.parallel.tp, args.parallel.pp
    heads = max(1, cfg.num_key_value_heads // tp) / cfg.num_key_value_heads
    return heads / pp


def weight_bytes(args: EngineArgs, cfg: ModelConfig) -> int:
    """This rank's weights as stored (block-FP8 projections and their scales under a quantization_config or
    online FP8): the main model's stage (its tp shards), the MTP modules (one decoder layer and the fc each, on the
    last stage), a draft model's whole tensor set, the vision tower."""
    elem = torch.empty((), dtype=args.dtype).element_size()
    tp, pp = args.parallel.tp, args.parallel.pp

    def model_bytes(c: ModelConfig, shard: int) -> int:  # as stored: block-FP8 projections with their scales
        quant = c.quantization or args.online_quant
        return sum(spec_bytes(spec, args.dtype, quant, shard) for spec in model_class(c).weight_specs(c))

    total = model_bytes(cfg, tp) // pp
    spec = args.spec
    if spec is not None and spec.mode is MtpMode.DRAFT_MODEL:
        total += model_bytes(ModelConfig.from_model_dir(spec.draft_model_dir), 1)
    elif spec is not None:
        layer = (model_bytes(cfg, tp) - cfg.vocab_size * cfg.hidden_size * elem * (1 if cfg.tie_word_embeddings else 2)
                 // tp) // cfg.num_hidden_layers  # fmt: skip
        total += spec.num_draft_modules * (layer + 2 * cfg.hidden_size * cfg.hidden_size * elem // tp)
    if cfg.vision is not None:  # the tower, loaded where images are served (else cleared from cfg): whole, unquantized,
        total += sum(spec_bytes(s, args.dtype, None) for s in VisionTower.specs(cfg.vision))  # on every rank
    return total


def activation_reserve(args: EngineArgs, cfg: ModelConfig) -> int:
    """A prefill chunk's activations and the logits of a full verify batch, plus the fixed reserve."""
    elem = torch.empty((), dtype=args.dtype).element_size()
    ffn = cfg.intermediate_size or (cfg.moe.moe_intermediate_size * cfg.moe.num_experts_per_tok)
    rows = args.chunked_prefill_size
    activations = rows * (ACTIVATION_ROWS_FACTOR * cfg.hidden_size + 3 * ffn) * elem // args.parallel.tp
    k = args.spec.num_draft_tokens if args.spec is not None else 0
    logits = args.max_batch_size * (k + 1) * cfg.vocab_size * 4
    return FIXED_RESERVE_BYTES + activations + logits


def memory_plan(args: EngineArgs, cfg: ModelConfig, snapshot_bytes: int, mem_fraction: float, total: int,
                free: int) -> MemoryPlan:  # fmt: skip
    """total / free: the GPU's memory (torch.cuda.mem_get_info) before this engine loads anything."""
    usable = int(total * mem_fraction) - (total - free)
    k = args.spec.num_draft_tokens if args.spec is not None else 0
    # each request slot (and the reserved padding slot): its conv window + SSM state, a row per verify position
    state = (args.max_batch_size + 1) * (k + 1) * snapshot_bytes // args.parallel.world_size
    return MemoryPlan(usable, weight_bytes(args, cfg), state, activation_reserve(args, cfg))


def budget_tokens_from_memory(args: EngineArgs, cfg: ModelConfig, kv_bytes_per_token: int, snapshot_bytes: int,
                              min_tokens: int) -> int:  # fmt: skip
    """The budget, in KV tokens as max_total_token_num counts them, that fits this GPU at `mem_fraction`; with the
    prefix cache, cache_budget.split_budget then gives part of it to snapshots."""
    free, total = torch.cuda.mem_get_info(args.device)
    plan = memory_plan(args, cfg, snapshot_bytes, args.mem_fraction, total, free)
    per_token = kv_bytes_per_token * rank_share(cfg, args)
    tokens = int(plan.cache_bytes / per_token) if plan.cache_bytes > 0 else 0
    if tokens < min_tokens:
        raise ValueError(
            f"mem_fraction {args.mem_fraction}: {max(plan.cache_bytes, 0) / 2**30:.2f} GiB left for the KV pool after "
            f"weights {plan.weights / 2**30:.2f} GiB, request state {plan.request_state / 2**30:.2f} GiB and reserve "
            f"{plan.reserve / 2**30:.2f} GiB of {plan.usable / 2**30:.2f} GiB usable: fewer than the {min_tokens} KV "
            "tokens of one max_model_len request; raise mem_fraction, lower max_model_len / max_batch_size"
        )
    return tokens
