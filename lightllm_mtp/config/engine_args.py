"""Engine-level settings, parsed once. The CLI and the offline LLM both build an EngineArgs; it accepts what users
of other engines pass ("float32" or torch.float32, "cuda:1" or torch.device("cuda", 1), "eagle_with_att" or
MtpMode.EAGLE_WITH_ATT) and holds the typed values from then on."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from lightllm_mtp.config.parallel_config import ParallelConfig
from lightllm_mtp.config.runtime import LoadFormat
from lightllm_mtp.config.spec_config import MtpMode, SpecConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(value: str | torch.dtype, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA, float32 on CPU."""
    if isinstance(value, torch.dtype):
        if value not in _DTYPES.values():
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {value}")
        return value
    if value == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if value not in _DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {value!r}")
    return _DTYPES[value]


def parse_device(value: str | torch.device) -> torch.device:
    text = str(value)
    if text not in ("cpu", "cuda") and not text.startswith("cuda:"):
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {value!r}")
    device = torch.device(text)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {text!r} asked for but CUDA is not available")
    return device


logger = logging.getLogger("lightllm_mtp.config")

@dataclass(frozen=True)
class EngineArgs:
    model_dir: str
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype | str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA; a torch.dtype after parsing
    max_model_len: int | None = None  # None: min(config max_position_embeddings, 4096)
    max_batch_size: int = 8  # concurrent requests (request slots)
    max_total_token_num: int | None = None  # KV pool token slots; None: max_batch_size * max_model_len
    chunked_prefill_size: int = 4096  # token budget of one forward (prefill chunks + decode rows)
    load_format: LoadFormat = LoadFormat.AUTO  # DUMMY: random weights (benchmarks)
    graph_max_batch_size: int = 64  # largest decode batch replayed from a CUDA graph (0: no graphs)
    mtp_mode: MtpMode | None = None
    mtp_step: int = 0  # draft tokens per step when mtp_mode is set (1..7)
    mtp_draft_model_dir: str | None = None  # where mtp.* live (None: model_dir); mtp_mode draft_model: the draft
    parallel_drafting: bool = False  # one draft forward drafts all mtp_step tokens (PTD with eagle, PARD with draft)
    mtp_mask_token_id: int | None = None  # PARD's mask token (None: from the draft's config)
    mtp_draft_vocab_file: str | None = None  # frequency-ranked token ids of a reduced draft vocabulary
    mtp_draft_vocab_size: int | None = None  # draft logits over the first N of them (None: all in the file)
    mtp_adaptive: bool = False  # each step drafts 0..mtp_step tokens, picked from live acceptance and step cost
    mtp_force_acceptance: str | None = None  # benchmarks, changes outputs: accept drafts unchecked: 0.8,0.6 | mean=2.2
    disable_overlap: bool = False  # read each step's tokens before queuing the next (no overlap scheduling)
    # one request's prompt chunk of <= 512 tokens replays a CUDA graph (common/basemodel/prefill_graph.py; with
    # graph_max_batch_size > 0, the prefix cache, fla-core, one process)
    prefill_cuda_graphs: bool = True
    warm_up: bool = True  # server workers on CUDA: a short synthetic workload before taking requests (engine/warm_up.py)
    tp: int = 1  # tensor-parallel ranks (one process each; engine/parallel/)
    pp: int = 1  # pipeline stages (one process per stage and tp rank)
    dist_timeout_s: float = 120.0  # a collective that waits longer ends the whole tp x pp group with an error
    prefix_cache: bool = True  # share cached prompt prefixes between requests (radix tree + GDN state snapshots)
    prefix_cache_interval: int = 256  # tokens between GDN state snapshots taken during prefill
    # share of the memory budget (max_total_token_num KV slots' bytes) held by GDN snapshots (engine/cache_budget.py);
    # None: sized for a few snapshots per request slot, between 0.1 and 0.5 of the budget
    prefix_cache_state_share: float | None = None
    prefix_cache_host_gb: float = 0.0  # pinned host memory for evicted GDN snapshots (0: none)
    spec: SpecConfig | None = field(init=False)  # the speculative settings, None without MTP
    parallel: ParallelConfig = field(init=False)  # tp x pp

    def __post_init__(self) -> None:
        device = parse_device(self.device)
        set_field = object.__setattr__
        set_field(self, "model_dir", str(self.model_dir))
        set_field(self, "device", device)
        set_field(self, "dtype", parse_dtype(self.dtype, device))
        try:
            set_field(self, "load_format", LoadFormat(self.load_format))
        except ValueError:
            raise ValueError(f"load_format must be one of {[f.value for f in LoadFormat]}, got {self.load_format!r}")
        if self.mtp_mode in (None, "none"):
            set_field(self, "mtp_mode", None)
            if self.mtp_step:
                raise ValueError("mtp_step is set but mtp_mode is not")
        else:
            set_field(self, "mtp_mode", MtpMode.parse(self.mtp_mode))
        set_field(self, "spec", SpecConfig.from_args(
            self.mtp_mode, self.mtp_step, self.mtp_draft_model_dir, self.parallel_drafting, self.mtp_draft_vocab_file,
            self.mtp_draft_vocab_size, adaptive=self.mtp_adaptive, mask_token_id=self.mtp_mask_token_id,
            force_acceptance=self.mtp_force_acceptance,
        ))
        set_field(self, "parallel", ParallelConfig(self.tp, self.pp))
        if self.spec is not None and self.parallel.world_size > 1:
            if self.spec.adaptive:  # the followers would need the driver's chosen k in the step description
                raise ValueError("mtp_adaptive is not supported with tp/pp > 1 yet")
            if self.spec.mode is MtpMode.DRAFT_MODEL:  # the draft model is not sharded across ranks
                raise ValueError("mtp_mode draft_model is not supported with tp/pp > 1 yet")
        if self.dist_timeout_s <= 0:
            raise ValueError(f"dist_timeout_s must be > 0, got {self.dist_timeout_s}")
        for name in ("max_batch_size", "chunked_prefill_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prefix_cache_interval < 1:
            raise ValueError(f"prefix_cache_interval must be >= 1, got {self.prefix_cache_interval}")
        if not self.prefix_cache_host_gb >= 0.0:
            raise ValueError(f"prefix_cache_host_gb must be >= 0, got {self.prefix_cache_host_gb}")
        if self.prefix_cache_state_share is not None and not 0.0 < self.prefix_cache_state_share < 1.0:
            raise ValueError(f"prefix_cache_state_share must be in (0, 1), got {self.prefix_cache_state_share}")
        if self.graph_max_batch_size < 0:
            raise ValueError(f"graph_max_batch_size must be >= 0, got {self.graph_max_batch_size}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_total_token_num is not None and self.max_total_token_num < 1:
            raise ValueError(f"max_total_token_num must be >= 1, got {self.max_total_token_num}")

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
