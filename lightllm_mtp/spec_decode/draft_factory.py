"""The one draft factory: (model type, MTP mode) -> the proposer, its MTP modules sharing the main model's
managers, behind their CUDA graphs."""

from __future__ import annotations

import importlib

import torch

from lightllm_mtp.common.basemodel.basemodel import TpPartBaseModel
from lightllm_mtp.common.basemodel.cuda_graph import CudaGraphSet, GraphedForward
from lightllm_mtp.common.basemodel.forward_batch import ForwardMode
from lightllm_mtp.common.layers.embedding import LMHead
from lightllm_mtp.common.parallel_state import tp_all_gather_rows
from lightllm_mtp.config.model_config import ModelType
from lightllm_mtp.config.spec_config import MtpMode, SpecConfig
from lightllm_mtp.spec_decode.draft_model_loader import load_draft_model, pard_mask_token
from lightllm_mtp.spec_decode.draft_model_proposer import DraftModelProposer
from lightllm_mtp.spec_decode.mtp_proposer import EagleMtpProposer, MultiLayerMtpProposer, ParallelMtpProposer
from lightllm_mtp.spec_decode.draft_vocab import load_draft_vocab
from lightllm_mtp.spec_decode.proposer import Proposer
from lightllm_mtp.spec_decode.step_builder import StepBuilder

_DENSE = "lightllm_mtp.models.qwen3_5_mtp.model:Qwen3_5MTPModel"
_MOE = "lightllm_mtp.models.qwen3_5_moe_mtp.model:Qwen3_5MoeMTPModel"
SUPPORTED_DRAFTS: dict[tuple[ModelType, MtpMode], str] = {
    (ModelType.QWEN3_5, MtpMode.EAGLE_WITH_ATT): _DENSE,
    (ModelType.QWEN3_5, MtpMode.VANILLA_WITH_ATT): _DENSE,
    (ModelType.QWEN3_5_MOE, MtpMode.EAGLE_WITH_ATT): _MOE,
    (ModelType.QWEN3_5_MOE, MtpMode.VANILLA_WITH_ATT): _MOE,
}


def create_drafts(
    main: TpPartBaseModel, spec: SpecConfig, main_model_dir: str, token_map: torch.Tensor | None = None
) -> list:
    """eagle: one module on mtp.layers.0; vanilla: module j on mtp.layers.j for j < k.
    Draft module j owns KV pool layer (number of main full-attention layers) + j."""
    key = (main.cfg.model_type, spec.mode)
    if key not in SUPPORTED_DRAFTS:
        raise ValueError(f"no MTP draft for model type {key[0].value} in mode {key[1].value}")
    if spec.num_draft_modules > main.cfg.mtp_num_hidden_layers:
        raise ValueError(
            f"mtp_mode {spec.mode.value} with mtp_step {spec.num_draft_tokens} needs {spec.num_draft_modules} MTP "
            f"layers; the checkpoint config declares mtp_num_hidden_layers={main.cfg.mtp_num_hidden_layers}"
        )
    module, cls_name = SUPPORTED_DRAFTS[key].split(":")
    cls = getattr(importlib.import_module(module), cls_name)
    model_dir = spec.draft_model_dir or main_model_dir
    first_kv = main.num_kv_layers  # this stage's (the last one's) KV layers come first in its pool
    lm_head = None
    if token_map is not None:  # the subset's rows, whole on every tp rank (gathered once from the vocab shards)
        rows = tp_all_gather_rows(main.lm_head.weight)[: main.cfg.vocab_size]
        lm_head = LMHead(rows[token_map].contiguous(), vocab_parallel=False)
        del rows
    return [
        cls(main, model_dir, mtp_layer=j, kv_layer=first_kv + j, parallel_drafting=spec.parallel_drafting,
            lm_head=lm_head)
        for j in range(spec.num_draft_modules)
    ]  # fmt: skip


def draft_token_map(main: TpPartBaseModel, spec: SpecConfig) -> torch.Tensor | None:
    """The reduced draft vocabulary's token ids on the model's device (eos ids always in), or None."""
    if spec.draft_vocab_file is None:
        return None
    ids = load_draft_vocab(spec.draft_vocab_file, spec.draft_vocab_size, main.cfg.vocab_size, main.cfg.eos_token_ids)
    return ids.to(main.rt.device)


def create_proposer(
    main: TpPartBaseModel, spec: SpecConfig, main_model_dir: str, builder: StepBuilder, graph_max_batch_size: int,
    graph_pool, rope_scaling: dict | None = None,
) -> Proposer:  # fmt: skip
    """The proposer of `spec` over the checkpoint's MTP modules (rope_scaling: the engine's RoPE override, which a
    draft model takes as the target does). With CUDA graphs (graph_max_batch_size > 0)
    each module replays its draft-window pass (EXTEND, window rows per request) and the eagle module its chain
    steps (DECODE, one row per request)."""
    token_map = draft_token_map(main, spec)
    if spec.mode is MtpMode.DRAFT_MODEL:
        return create_draft_model_proposer(main, spec, main_model_dir, builder, graph_max_batch_size, graph_pool,
                                           token_map, rope_scaling)  # fmt: skip
    drafts = create_drafts(main, spec, main_model_dir, token_map)
    k = spec.num_draft_tokens
    if spec.parallel_drafting:
        window_rows, chain = 2 * k, False
    elif spec.mode is MtpMode.EAGLE_WITH_ATT:
        window_rows, chain = k + 1, k > 1
    else:
        window_rows, chain = spec.num_context_rows + k + 1, False
    modules = []
    # adaptive speculation's k = 0 steps run the single module's window pass for its KV only, without logits
    keep_kv_only = spec.adaptive and spec.num_draft_modules == 1
    for draft in drafts:
        layouts = [(ForwardMode.EXTEND, window_rows, True)] + ([(ForwardMode.DECODE, 1, True)] if chain else [])
        layouts += [(ForwardMode.EXTEND, window_rows, False)] if keep_kv_only else []
        graphs = [
            CudaGraphSet(draft.forward, main.caches, mode, rows, graph_max_batch_size, graph_pool,
                         hidden_size=main.cfg.hidden_size, hidden_dtype=main.rt.dtype, logits=logits)
            for mode, rows, logits in layouts
        ] if graph_max_batch_size > 0 else []  # fmt: skip
        modules.append(GraphedForward(draft.forward, graphs))
    if spec.parallel_drafting:
        proposer = ParallelMtpProposer(modules, builder, drafts[0].mask_hidden, token_map=token_map)
    elif spec.mode is MtpMode.EAGLE_WITH_ATT:
        proposer = EagleMtpProposer(modules, builder, token_map=token_map)
    else:
        proposer = MultiLayerMtpProposer(modules, builder, token_map=token_map)
    assert proposer.window_rows == window_rows
    return proposer


def create_draft_model_proposer(
    main: TpPartBaseModel, spec: SpecConfig, main_model_dir: str, builder: StepBuilder, graph_max_batch_size: int,
    graph_pool, token_map: torch.Tensor | None, rope_scaling: dict | None = None,
) -> DraftModelProposer:  # fmt: skip
    """The external draft model behind its CUDA graphs: the window pass (VERIFY, k+1 rows; PARD 2k) and the
    autoregressive chain steps (VERIFY, 1 row, writing one state position on)."""
    draft = load_draft_model(main, main_model_dir, spec, token_map, rope_scaling)
    k = spec.num_draft_tokens
    mask_token = pard_mask_token(spec, draft) if spec.parallel_drafting else None
    window_rows = 2 * k if spec.parallel_drafting else k + 1
    layouts = [(window_rows, False)] + ([(1, True)] if k > 1 and not spec.parallel_drafting else [])
    graphs = [
        CudaGraphSet(draft.forward, draft.caches, ForwardMode.VERIFY, rows, graph_max_batch_size, graph_pool,
                     state_write=state_write)
        for rows, state_write in layouts
    ] if graph_max_batch_size > 0 else []  # fmt: skip
    proposer = DraftModelProposer(
        draft, GraphedForward(draft.forward, graphs[:1]), GraphedForward(draft.forward, graphs[1:]), builder,
        mask_token, token_map,
    )  # fmt: skip
    assert proposer.window_rows == window_rows
    return proposer
