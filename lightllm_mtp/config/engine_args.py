"""Engine-level settings, validated once. The CLI and the offline LLM both build an EngineArgs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightllm_mtp.config.runtime import LoadFormat
from lightllm_mtp.config.spec_config import SpecConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineArgs:
    model_dir: str
    device: str = "cpu"
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    max_model_len: int | None = None  # None: min(config max_position_embeddings, 4096)
    max_batch_size: int = 8  # concurrent requests (request slots)
    max_total_token_num: int | None = None  # KV pool token slots; None: max_batch_size * max_model_len
    chunked_prefill_size: int = 4096  # token budget of one forward (prefill chunks + decode rows)
    load_format: str = "auto"  # auto: the checkpoint's safetensors; dummy: random weights (benchmarks)
    graph_max_batch_size: int = 64  # largest decode batch replayed from a CUDA graph (0: no graphs)
    mtp_mode: str | None = None  # None, "eagle_with_att" or "vanilla_with_att"
    mtp_step: int = 0  # draft tokens per step when mtp_mode is set (1..7)
    mtp_draft_model_dir: str | None = None  # where mtp.* live; None: model_dir
    disable_overlap: bool = False  # read each step's tokens before queuing the next (no overlap scheduling)

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} asked for but CUDA is not available")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {self.dtype!r}")
        for name in ("max_batch_size", "chunked_prefill_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        LoadFormat(self.load_format)  # raises on an unknown format
        if self.graph_max_batch_size < 0:
            raise ValueError(f"graph_max_batch_size must be >= 0, got {self.graph_max_batch_size}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_total_token_num is not None and self.max_total_token_num < 1:
            raise ValueError(f"max_total_token_num must be >= 1, got {self.max_total_token_num}")
        if self.mtp_mode is None and self.mtp_step:
            raise ValueError("mtp_step is set but mtp_mode is not")
        self.spec_config  # validates mtp_mode / mtp_step / mtp_draft_model_dir

    @property
    def spec_config(self) -> SpecConfig | None:
        return SpecConfig.from_args(self.mtp_mode, self.mtp_step, self.mtp_draft_model_dir)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        return _DTYPES[self.dtype]

    def resolved_max_model_len(self, max_position_embeddings: int) -> int:
        if self.max_model_len is None:
            return min(max_position_embeddings, 4096)
        if self.max_model_len > max_position_embeddings:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings "
                f"{max_position_embeddings}"
            )
        return self.max_model_len

    def resolved_kv_pool_size(self, max_model_len: int) -> int:
        return self.max_total_token_num or self.max_batch_size * max_model_len
