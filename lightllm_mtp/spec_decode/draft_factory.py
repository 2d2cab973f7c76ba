"""The one draft factory: (model type, MTP mode) -> draft modules sharing the main model's managers."""

from __future__ import annotations

import importlib

from lightllm_mtp.common.basemodel.basemodel import TpPartBaseModel
from lightllm_mtp.config.model_config import ModelType
from lightllm_mtp.config.spec_config import MtpMode, SpecConfig

_DENSE = "lightllm_mtp.models.qwen3_5_mtp.model:Qwen3_5MTPModel"
_MOE = "lightllm_mtp.models.qwen3_5_moe_mtp.model:Qwen3_5MoeMTPModel"
SUPPORTED_DRAFTS: dict[tuple[ModelType, MtpMode], str] = {
    (ModelType.QWEN3_5, MtpMode.EAGLE_WITH_ATT): _DENSE,
    (ModelType.QWEN3_5, MtpMode.VANILLA_WITH_ATT): _DENSE,
    (ModelType.QWEN3_5_MOE, MtpMode.EAGLE_WITH_ATT): _MOE,
    (ModelType.QWEN3_5_MOE, MtpMode.VANILLA_WITH_ATT): _MOE,
}


def create_drafts(main: TpPartBaseModel, spec: SpecConfig, main_model_dir: str) -> list:
    """eagle: one module on mtp.layers.0; vanilla: module j on mtp.layers.j for j < mtp_step.
    Draft module j owns KV pool layer (number of main full-attention layers) + j."""
    key = (main.cfg.model_type, spec.mode)
    if key not in SUPPORTED_DRAFTS:
        raise ValueError(f"no MTP draft for model type {key[0].value} in mode {key[1].value}")
    if spec.num_draft_modules > main.cfg.mtp_num_hidden_layers:
        raise ValueError(
            f"mtp_mode {spec.mode.value} with mtp_step {spec.num_steps} needs {spec.num_draft_modules} MTP layers; "
            f"the checkpoint config declares mtp_num_hidden_layers={main.cfg.mtp_num_hidden_layers}"
        )
    module, cls_name = SUPPORTED_DRAFTS[key].split(":")
    cls = getattr(importlib.import_module(module), cls_name)
    model_dir = spec.draft_model_dir or main_model_dir
    first_kv = len(main.cfg.full_attention_layers)
    return [cls(main, model_dir, mtp_layer=j, kv_layer=first_kv + j) for j in range(spec.num_draft_modules)]
