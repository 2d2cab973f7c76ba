"""Builds one process's model and step runner (plain or speculative): the driver's LLMEngine and every follower
rank of a tensor / pipeline parallel group build theirs with this same code, each from its own rank's shard."""

from __future__ import annotations

from dataclasses import dataclass, replace

from lightllm_mtp.common.basemodel.basemodel import TpPartBaseModel
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.config.parallel_config import RankInfo
from lightllm_mtp.config.runtime import RuntimeShape
from lightllm_mtp.engine.model_runner import ModelRunner
from lightllm_mtp.engine.spec_runner import SpecRunner
from lightllm_mtp.engine.step import StepRunner
from lightllm_mtp.models.registry import create_model
from lightllm_mtp.spec_decode.draft_factory import create_proposer
from lightllm_mtp.spec_decode.draft_state import DraftState
from lightllm_mtp.spec_decode.step_builder import StepBuilder


@dataclass
class BuiltRunner:
    model: TpPartBaseModel
    model_runner: ModelRunner
    runner: StepRunner  # model_runner, or the SpecRunner over it


def build_runner(args: EngineArgs, cfg: ModelConfig, max_model_len: int, rank: RankInfo | None = None) -> BuiltRunner:
    rank = rank or RankInfo(args.parallel)
    spec = args.spec
    rt = RuntimeShape(
        dtype=args.dtype,
        device=args.device,
        max_reqs=args.max_batch_size,
        max_model_len=max_model_len,
        kv_pool_size=args.resolved_kv_pool_size(max_model_len),
        num_draft_tokens=spec.num_draft_tokens if spec else 0,
        draft_kv_layers=spec.num_draft_modules if spec else 0,
        load_format=args.load_format,
        rank=rank,
    )
    model = create_model(args.model_dir, cfg, rt)
    # CUDA graphs per rank under tp (the all-reduces are captured); none under pp (stage-to-stage send / recv)
    graph_max = min(args.graph_max_batch_size, args.max_batch_size) if args.parallel.pp == 1 else 0
    model_runner = ModelRunner(model, graph_max, num_draft_tokens=spec.num_draft_tokens if spec else 0)
    runner: StepRunner = model_runner
    if spec is not None:
        state = DraftState(
            args.max_batch_size, spec.num_draft_tokens, args.device, spec.num_context_rows, cfg.hidden_size, args.dtype
        )
        caches = model.caches
        builder = StepBuilder(state, caches.req_manager.req_to_token, max_model_len, caches.kv_pool.hold_slot)
        proposer = None
        if model.is_last_stage:  # the drafts run where the final hidden is
            proposer = create_proposer(
                model, spec, args.model_dir, builder, model_runner.graph_max_batch_size, model_runner.graph_pool
            )
        runner = SpecRunner(model_runner, proposer, builder)
    return BuiltRunner(model, model_runner, runner)


def rank_args(args: EngineArgs, rank: int) -> EngineArgs:
    """The driver's args as rank `rank` sees them: on CUDA, one GPU per rank after the driver's."""
    if args.device.type != "cuda":
        return args
    return replace(args, device=f"cuda:{(args.device.index or 0) + rank}")
