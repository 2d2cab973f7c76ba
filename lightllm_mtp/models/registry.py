"""Model type -> model class (lazy imports keep start-up cheap)."""

from __future__ import annotations

import importlib
from pathlib import Path

from lightllm_mtp.common.basemodel.basemodel import TpPartBaseModel
from lightllm_mtp.config.runtime import RuntimeShape
from lightllm_mtp.config.model_config import ModelConfig, ModelType

SUPPORTED_MODELS: dict[ModelType, str] = {
    ModelType.QWEN3_5: "lightllm_mtp.models.qwen3_5.model:Qwen3_5Model",
    ModelType.QWEN3_5_MOE: "lightllm_mtp.models.qwen3_5_moe.model:Qwen3_5MoeModel",
}

# the MTP head's module class of each model type (its weight_specs(cfg, j) declares mtp.layers.j's tensors)
MTP_MODELS: dict[ModelType, str] = {
    ModelType.QWEN3_5: "lightllm_mtp.models.qwen3_5_mtp.model:Qwen3_5MTPModel",
    ModelType.QWEN3_5_MOE: "lightllm_mtp.models.qwen3_5_moe_mtp.model:Qwen3_5MoeMTPModel",
}


def _load(path: str):
    module, cls = path.split(":")
    return getattr(importlib.import_module(module), cls)


def mtp_model_class(cfg: ModelConfig):
    return _load(MTP_MODELS[cfg.model_type])


def model_class(cfg: ModelConfig) -> type[TpPartBaseModel]:
    return _load(SUPPORTED_MODELS[cfg.model_type])


def create_model(model_dir: str | Path, cfg: ModelConfig, rt: RuntimeShape) -> TpPartBaseModel:
    return model_class(cfg)(model_dir, cfg, rt)
