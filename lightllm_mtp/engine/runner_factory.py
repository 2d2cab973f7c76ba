"""Builds one process's model, step runner (plain or speculative) and prefix cache: the driver's LLMEngine and every
follower rank of a tensor / pipeline parallel group build theirs with this same code, each from its own rank's shard.
The memory split (engine/cache_budget.py) is model-wide, so every rank gets the same KV slots and snapshot slots."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from lightllm_mtp.common.basemodel.basemodel import TpPartBaseModel
from lightllm_mtp.common.basemodel.cuda_graph import graph_batch_sizes
from lightllm_mtp.common.host_snapshots import HostSnapshotTier
from lightllm_mtp.common.radix_cache import RadixCache
from lightllm_mtp.common.state_snapshots import StateSnapshotPool
from lightllm_mtp.common.parallel_state import check_layout, state as parallel_state
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.config.parallel_config import RankInfo
from lightllm_mtp.config.runtime import RuntimeShape
from lightllm_mtp.config.spec_config import MtpMode
from lightllm_mtp.engine.cache_budget import CacheBudget, cache_budget_of
from lightllm_mtp.engine.image_rows import ImageRows
from lightllm_mtp.engine.model_runner import ModelGraphs, ModelRunner, capture_model_graphs
from lightllm_mtp.engine.prefix_cache import CacheJournal, PrefixCache
from lightllm_mtp.engine.spec_runner import SpecRunner
from lightllm_mtp.engine.step import StepRunner
from lightllm_mtp.models.qwen3_5_vision.tower import VisionTower
from lightllm_mtp.models.registry import create_model
from lightllm_mtp.spec_decode.adaptive import SpecLengthController, StepCostTable
from lightllm_mtp.spec_decode.draft_factory import create_proposer
from lightllm_mtp.spec_decode.draft_state import DraftState
from lightllm_mtp.spec_decode.proposer import Proposer
from lightllm_mtp.spec_decode.step_builder import StepBuilder
from lightllm_mtp.spec_decode.step_cost import (
    CONTEXT_PROBE_TOKENS,
    context_cost_per_row,
    measured_step_costs,
    row_count_step_costs,
)
from lightllm_mtp.spec_decode.verify import ForcedAcceptRule

logger = logging.getLogger("lightllm_mtp.engine")


@dataclass
class BuiltRunner:
    model: TpPartBaseModel
    model_runner: ModelRunner
    runner: StepRunner  # model_runner, or the SpecRunner over it
    budget: CacheBudget
    prefix_cache: PrefixCache | None = None  # args.prefix_cache


def build_runner(args: EngineArgs, cfg: ModelConfig, max_model_len: int, rank: RankInfo | None = None,
                 journal: CacheJournal | None = None) -> BuiltRunner:  # fmt: skip
    """journal: the driver's of a tp / pp group (engine/parallel/journal.py), told of the prefix cache's calls made
    outside the runner; None on a follower and in one process."""
    rank = rank or RankInfo(args.parallel)
    check_layout(rank)  # a second engine beside a live tp / pp group of this process is refused here
    spec = args.spec
    budget = cache_budget_of(args, cfg, max_model_len)
    rt = RuntimeShape(
        dtype=args.dtype,
        device=args.device,
        max_reqs=args.max_batch_size,
        max_model_len=max_model_len,
        kv_pool_size=budget.kv_tokens,
        num_draft_tokens=spec.num_draft_tokens if spec else 0,
        draft_kv_layers=spec.num_draft_modules if spec else 0,
        load_format=args.load_format,
        rank=rank,
        online_quant=args.online_quant,
        kv_dtype=args.kv_dtype,
        draft_kv_dtype=args.draft_kv_dtype,
    )
    model = create_model(args.model_dir, cfg, rt)
    graphs = capture_model_graphs(
        model, _graph_max_batch_size(args, rank), num_draft_tokens=spec.num_draft_tokens if spec else 0,
        adaptive=spec is not None and spec.adaptive,
    )  # fmt: skip
    proposer = builder = controller = forced = None
    if spec is not None:
        state = DraftState(
            args.max_batch_size, spec.num_draft_tokens, args.device, spec.num_context_rows, cfg.hidden_size, args.dtype
        )
        caches = model.caches
        builder = StepBuilder(state, caches.req_manager.req_to_token, max_model_len, caches.kv_pool.hold_slot)
        if model.is_last_stage:  # the drafts run where the final hidden is
            proposer = create_proposer(model, spec, args.model_dir, builder, graphs.max_batch_size, graphs.pool,
                                       args.rope_scaling)  # fmt: skip
        controller = SpecLengthController(_step_costs(graphs, model, proposer, spec)) if spec.adaptive else None
        if spec.force_acceptance is not None:
            forced = ForcedAcceptRule.on_device(spec.force_acceptance, args.device)
            if rank.rank == 0:
                logger.warning(
                    "mtp_force_acceptance %s: drafts are accepted WITHOUT being checked (per-position rates %s, "
                    "expected accept length %.3f per verify step); outputs are NOT the model's. For benchmarks only.",
                    spec.force_acceptance.setting, ", ".join(f"{r:.4f}" for r in spec.force_acceptance.rates),
                    spec.force_acceptance.mean_accept_length,
                )  # fmt: skip
    prefix_cache = _build_prefix_cache(args, model, proposer, budget, journal) if args.prefix_cache else None
    image_rows = _image_rows(args, model, proposer)
    model_runner = ModelRunner(model, graphs, prefix_cache, eos_token_ids=model_eos_ids(args.model_dir, cfg),
                               image_rows=image_rows)  # fmt: skip
    runner: StepRunner = model_runner
    if spec is not None:
        runner = SpecRunner(model_runner, proposer, builder, controller, forced)
    if args.prefill_cuda_graphs:
        model_runner.add_prefill_graphs(keep_all_hidden=spec is not None, max_chunk_rows=args.chunked_prefill_size,
                                        max_model_len=max_model_len)  # fmt: skip
    return BuiltRunner(model, model_runner, runner, budget, prefix_cache)


def _image_rows(args: EngineArgs, model: TpPartBaseModel, proposer: Proposer | None) -> ImageRows | None:
    """The vision tower (loaded beside the language model: bf16 also in FP8 checkpoints) behind the prompt forwards'
    image rows; None for text-only models (the engine clears ModelConfig.vision where images are not served)."""
    vision = model.cfg.vision
    if vision is None:
        return None
    tower = VisionTower.load(args.model_dir, vision, args.dtype, args.device, load_format=args.load_format)
    lookahead = proposer.lookahead if proposer is not None else 0
    return ImageRows(tower.forward, model.caches.rope_delta, args.device, lookahead)


def model_eos_ids(model_dir, cfg: ModelConfig) -> frozenset[int]:
    """The config's eos ids and generation_config.json's."""
    path = Path(model_dir) / "generation_config.json"
    eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    extra = () if eos is None else eos if isinstance(eos, list) else [eos]
    return frozenset(cfg.eos_token_ids) | frozenset(extra)


def _build_prefix_cache(args: EngineArgs, model: TpPartBaseModel, proposer: Proposer | None, budget: CacheBudget,
                        journal: CacheJournal | None) -> PrefixCache:  # fmt: skip
    """The tree over the KV pool and the snapshot pool, the two parts of one budget. Every rank of a tp / pp group
    gets the same slot counts (the host tier too: sized by the whole model's bytes per snapshot, so
    prefix_cache_host_gb is the engine's total over its ranks); each fills them with its own layers and shards.
    proposer: on the last pipeline stage only (a draft model's snapshot half and catch-up come from it)."""
    caches = model.caches
    state, kv = caches.req_manager.linear_state, caches.kv_pool
    caches.snapshots = StateSnapshotPool(state, budget.num_snapshots)
    draft_snapshots = draft_snapshot_pool(proposer, model, budget.num_snapshots)
    host = None
    if args.prefix_cache_host_gb > 0:
        num_host = HostSnapshotTier.slots_for(budget.snapshot_bytes, args.prefix_cache_host_gb)
        host = HostSnapshotTier(caches.snapshots, num_host, draft_snapshots)
    tree = RadixCache(kv, budget.num_snapshots, host)
    lookahead = args.spec.num_draft_modules if args.spec is not None else 0  # L: one position per MTP module
    if draft_snapshots is None:  # a draft model's KV needs no lookahead (L = 0, engine/prefix_cache.py)
        assert proposer is None or proposer.lookahead == lookahead, (proposer.lookahead, lookahead)
    return PrefixCache(tree, caches.snapshots, caches.req_manager, args.prefix_cache_interval, lookahead,
                       draft_snapshots, proposer.catch_up if draft_snapshots is not None else None,
                       journal)  # fmt: skip


def draft_snapshot_pool(proposer, model: TpPartBaseModel, num_snapshots: int) -> StateSnapshotPool | None:
    """mtp_mode draft_model: the draft's half of every snapshot slot, which its GDN layers fill from the same
    SnapshotPlan as the target's (its prompt chunks are the target's batch); None for other proposers. The plan's conv
    windows are laid out for the target's conv kernel, so the draft must have the same one."""
    draft = getattr(proposer, "draft", None)
    if draft is None:
        return None
    if draft.cfg.linear_conv_kernel_dim != model.cfg.linear_conv_kernel_dim:
        raise ValueError(
            f"the prefix cache with a draft model needs the draft's linear_conv_kernel_dim "
            f"({draft.cfg.linear_conv_kernel_dim}) equal to the target's ({model.cfg.linear_conv_kernel_dim}); "
            "pass prefix_cache=False (--disable_prefix_cache) for this draft"
        )
    pool = StateSnapshotPool(draft.caches.req_manager.linear_state, num_snapshots)
    draft.caches.snapshots = pool
    return pool


def _graph_max_batch_size(args: EngineArgs, rank: RankInfo) -> int:
    """CUDA graphs per rank: under tp the all-reduces are captured; under pp each stage captures its own layers
    (send / recv stay outside, common/basemodel/stage_graphs.py). Host-staged collectives (gloo on CUDA) cannot be
    captured: tp > 1 there runs eagerly."""
    graph_max = min(args.graph_max_batch_size, args.max_batch_size)
    if graph_max and args.parallel.tp > 1 and parallel_state().host_staged and args.device.type == "cuda":
        if rank.rank == 0:
            logger.warning("CUDA graphs off: tp=%d all-reduces over gloo (LIGHTLLM_MTP_DIST_BACKEND=gloo) are staged "
                           "through host memory and cannot be captured; every forward runs eagerly", args.parallel.tp)
        return 0
    return graph_max


def _step_costs(graphs: ModelGraphs, model: TpPartBaseModel, proposer: Proposer, spec) -> StepCostTable:
    """Adaptive speculation's step costs: the captured graphs timed, or rows through the forwards without graphs."""
    eagle_chain = spec.mode is MtpMode.EAGLE_WITH_ATT and not spec.parallel_drafting
    k = spec.num_draft_tokens
    if graphs.forward.graph_sets:
        verify = {g.q: g for g in graphs.forward.graph_sets}
        windows = [m.graph_sets[0] for m in proposer.modules]
        chain = proposer.modules[0].graph_sets[1] if eagle_chain and k > 1 else None
        kv_only = [g for g in proposer.modules[0].graph_sets if not g.logits]
        context = min(CONTEXT_PROBE_TOKENS, model.rt.max_model_len - k - 1)
        return measured_step_costs(verify, windows, chain, k, kv_only[0] if kv_only else None, context)
    sizes = graph_batch_sizes(model.caches.req_manager.max_reqs)
    return row_count_step_costs(sizes, k, proposer.window_rows, len(proposer.modules), eagle_chain,
                                context_cost_per_row(model.cfg))  # fmt: skip


def rank_args(args: EngineArgs, rank: int, shared_device: bool = False) -> EngineArgs:
    """The driver's args as rank `rank` sees them: on CUDA, one GPU per rank after the driver's (shared_device: the
    driver's GPU, for host-staged gloo collectives on one GPU)."""
    if args.device.type != "cuda" or shared_device:
        return args
    return replace(args, device=f"cuda:{(args.device.index or 0) + rank}")
