"""Engine-level settings, declared and parsed once. The CLI and the offline LLM both build an EngineArgs; it accepts
what users of other engines pass ("bf16", "float32" or torch.float32, "cuda:1" or torch.device("cuda", 1),
"eagle_with_att" or MtpMode.EAGLE_WITH_ATT) and holds the typed values from then on."""

from __future__ import annotations

import dataclasses

import logging
from dataclasses import dataclass, field

import torch

import json
import os
from pathlib import Path

from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.config.options import option
from lightllm_mtp.config.parallel_config import ParallelConfig
from lightllm_mtp.config.rope_scaling import RopeScalingError, rope_type_of
from lightllm_mtp.config.quant_config import FP8_BLOCK, QuantConfig
from lightllm_mtp.config.runtime import LoadFormat
from lightllm_mtp.config.spec_config import MAX_MTP_STEP, MtpMode, SpecConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def parse_dtype(value: str | torch.dtype, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA, float32 on CPU."""
    if isinstance(value, torch.dtype):
        if value not in _DTYPES.values():
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {value}")
        return value
    if value == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    value = _DTYPE_ALIASES.get(value, value)
    if value not in _DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)} (or {', '.join(_DTYPE_ALIASES)}), "
                         f"got {value!r}")
    return _DTYPES[value]


def parse_device(value: str | torch.device) -> torch.device:
    text = str(value)
    if text not in ("cpu", "cuda") and not text.startswith("cuda:"):
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {value!r}")
    device = torch.device(text)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {text!r} asked for but CUDA is not available")
    return device


def parse_rope_override(value: dict | str | None) -> dict | None:
    """The rope_scaling option: a JSON object (text on the CLI, a dict from LLM(...)) naming a supported rope_type;
    its other keys are checked against the model's config at start-up (config/rope_scaling.py)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"rope_scaling must be a JSON object, e.g. '{{\"rope_type\":\"yarn\",\"factor\":4,"
                             f"\"original_max_position_embeddings\":262144}}': {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"rope_scaling must be a JSON object, got {value!r}")
    if "rope_type" not in value and "type" not in value:
        raise ValueError(f"rope_scaling needs a 'rope_type' (yarn, linear, llama3 or default), got {value!r}")
    try:
        rope_type_of(value)
    except RopeScalingError as e:
        raise ValueError(f"rope_scaling: {e}") from None
    return dict(value)


logger = logging.getLogger("lightllm_mtp.config")

MODEL, MEMORY, SPEC, PARALLEL, CACHE = ("model", "batching and memory", "MTP speculative decoding", "parallelism",
                                       "prefix cache")  # fmt: skip
DTYPE_CHOICES = ("auto", *_DTYPES, *_DTYPE_ALIASES)
QUANTIZATION_CHOICES = ("none", "fp8")
KV_CACHE_DTYPE_CHOICES = ("auto", "fp8", "fp8_e4m3")
SMALL_MODEL_HIDDEN = 1024  # below this hidden size a CPU forward is latency-bound: one thread is fastest


@dataclass(frozen=True)
class EngineArgs:
    """Every engine option, declared once: `LLM(...)`'s keywords and the server's / main job's flags are derived from
    these fields (config/options.py, config/cli.py); the cross-field checks are in `__post_init__`."""

    model_dir: str = option(help="local checkpoint directory (config.json, safetensors, tokenizer)", group=MODEL,
                            aliases=("model",))
    device: torch.device | str = option(torch.device("cpu"), "cpu, cuda or cuda:N (with --dp N: replica i on "
                                        "cuda:i)", group=MODEL)
    dtype: torch.dtype | str = option("auto", "auto (bfloat16 on CUDA, float32 on CPU), bfloat16 / bf16, float16 / "
                                      "fp16 / half, float32 / fp32", group=MODEL, aliases=("data_type",),
                                      choices=DTYPE_CHOICES)
    load_format: LoadFormat | str = option(LoadFormat.AUTO, "auto: the checkpoint's safetensors; dummy: random "
                                           "weights of the checkpoint's shapes (benchmarks)", group=MODEL,
                                           choices=tuple(f.value for f in LoadFormat))
    rope_scaling: dict | str | None = option(None, "RoPE scaling replacing the checkpoint's, as JSON, e.g. "
                                             "'{\"rope_type\":\"yarn\",\"factor\":4,"
                                             "\"original_max_position_embeddings\":262144}' (yarn, linear, llama3; "
                                             "the checkpoint's rope_theta and M-RoPE fields are kept); max_model_len "
                                             "may then reach factor x original (docs/long_context.md)", group=MODEL,
                                             aliases=("rope_parameters",))
    quantization: str | None = option(None, "fp8: quantize the checkpoint's 16 / 32-bit projection weights to "
                                      "block-FP8 (128x128 blocks, the published -FP8 layout) at load; none: weights "
                                      "as stored (an -FP8 checkpoint loads FP8 by its quantization_config either way)",
                                      group=MODEL, choices=QUANTIZATION_CHOICES)
    language_model_only: bool = option(False, "do not load an image-text checkpoint's vision tower (model.visual.*): "
                                       "text only, requests with images are refused", group=MODEL)
    limit_mm_per_prompt: int = option(8, "most images in one request (0: images refused)", group=MODEL)
    max_image_bytes: int = option(20 * 2**20, "largest encoded image accepted (a data: URI's decoded bytes, a file); "
                                  "the server's --max_request_body_bytes also bounds a data: URI", group=MODEL)
    max_image_pixels: int = option(4096 * 4096, "largest image accepted, width x height (read from its header "
                                   "before it is decoded)", group=MODEL)
    allowed_local_media_path: str | None = option(None, "file:// image URLs in chat messages are read only inside "
                                                  "this directory (symlinks and '..' resolved); none: refused",
                                                  group=MODEL)
    cpu_threads: int | None = option(None, "torch threads of each process on CPU (none: 1 for models with hidden "
                                     f"size < {SMALL_MODEL_HIDDEN}, which are latency-bound, else the cores divided "
                                     "among this host's engine processes)", group=MODEL)
    max_model_len: int | None = option(None, "prompt + generated tokens per request (none: min(the model's "
                                       "max_position_embeddings, 4096))", group=MEMORY, aliases=("max_req_total_len",))
    max_batch_size: int = option(32, "concurrent requests (request slots); more wait in the queue", group=MEMORY,
                                 aliases=("running_max_req_size", "max_num_seqs"))
    max_total_token_num: int | None = option(None, "KV pool size in tokens (none: sized by --mem_fraction on CUDA "
                                             "when given, else max_batch_size x (max_model_len + a request's KV "
                                             "lookahead slots), so every request max_model_len allows is admitted)", group=MEMORY)
    mem_fraction: float | None = option(None, "CUDA: size the KV pool (and prefix-cache snapshots) so that this "
                                        "process uses at most this fraction of the GPU's memory, weights included "
                                        "(ignored when --max_total_token_num is given)", group=MEMORY,
                                        aliases=("gpu_memory_utilization",))
    chunked_prefill_size: int = option(4096, "token budget of one forward: decode rows (1 + mtp_step each) then "
                                       "prompt chunks", group=MEMORY, aliases=("max_num_batched_tokens",))
    graph_max_batch_size: int = option(64, "largest decode / verify batch replayed from a CUDA graph (0: none)",
                                       group=MEMORY, consts={"disable_cudagraph": 0})
    prefill_cuda_graphs: bool = option(True, "CUDA: one request's prompt chunk of <= 512 tokens replays a CUDA graph "
                                       "(with the prefix cache, fla-core, one process)", group=MEMORY,
                                       negations=("disable_prefill_cudagraph",))
    kv_cache_dtype: str = option("auto", "auto: the model dtype; fp8 (= fp8_e4m3): the target's full-attention KV "
                                 "cache in e4m3 with per-tensor scales (1.0 unless the checkpoint has "
                                 "self_attn.k_scale / v_scale), half the KV bytes; the GDN state is unchanged",
                                 group=MEMORY, choices=KV_CACHE_DTYPE_CHOICES)
    disable_overlap: bool = option(False, "read each step's tokens before queuing the next (by default the next "
                                   "step is queued on the device while the host handles the current one)",
                                   group=MEMORY)
    warm_up: bool = option(True, "server workers on CUDA run a short synthetic workload before taking requests, so "
                           "that compiling kernel variants does not fall on the first users", group=MEMORY,
                           negations=("disable_warm_up",))
    mtp_mode: MtpMode | str | None = option(None, "draft with the checkpoint's MTP head: eagle_with_att runs "
                                            "mtp.layers.0 mtp_step times, vanilla_with_att uses mtp.layers.j for "
                                            "draft j; draft_model: a smaller checkpoint of the same vocabulary "
                                            "(--mtp_draft_model_dir) drafts (none: no speculation)", group=SPEC,
                                            choices=("none", *(m.value for m in MtpMode)))
    mtp_step: int = option(0, f"draft tokens per verify step, 1..{MAX_MTP_STEP} (needs --mtp_mode)", group=SPEC,
                           aliases=("num_speculative_tokens",))
    mtp_draft_model_dir: str | None = option(None, "where the mtp.* tensors live (none: model_dir); with mtp_mode "
                                             "draft_model, the draft checkpoint", group=SPEC)
    parallel_drafting: bool = option(False, "one draft forward drafts all mtp_step tokens from [next token, MASK x "
                                     "(mtp_step - 1)]: PTD with eagle_with_att (needs mtp.mask_embedding / "
                                     "mtp.mask_hidden), PARD with draft_model", group=SPEC)
    mtp_mask_token_id: int | None = option(None, "PARD's mask token id (none: the draft config's pard_token / "
                                           "mask_token_id)", group=SPEC)
    mtp_draft_vocab_file: str | None = option(None, "JSON of frequency-ranked token ids (python -m "
                                              "lightllm_mtp.tools.build_draft_vocab): the drafts' logits cover only "
                                              "those ids", group=SPEC)
    mtp_draft_vocab_size: int | None = option(None, "use the first N ids of --mtp_draft_vocab_file (eos and special "
                                              "ids always included)", group=SPEC)
    mtp_force_acceptance: str | None = option(None, "BENCHMARKS ONLY, changes outputs: accept drafts without "
                                              "checking them, at per-position rates (0.8,0.6,0.4: draft i accepted "
                                              "with that probability given drafts before it were) or at a mean "
                                              "accept length (mean=2.2: accepted drafts + 1 per verify step), so "
                                              "that random weights run MTP at a realistic acceptance; announced in "
                                              "the log, /server_info and /metrics", group=SPEC)
    draft_kv_cache_dtype: str = option("auto", "KV cache of the MTP draft modules / the draft model: auto = the "
                                       "model dtype (FP8 draft KV cost a peer acceptance: 2.7 -> 1.8 accept length); "
                                       "fp8 (= fp8_e4m3)", group=SPEC, choices=KV_CACHE_DTYPE_CHOICES)
    mtp_adaptive: bool = option(False, "each step drafts 0..mtp_step tokens, the number with the most expected "
                                "tokens per ms from live acceptance and the step cost measured at start-up",
                                group=SPEC)
    tp: int = option(1, "tensor-parallel ranks (one process each; NCCL on CUDA, gloo on CPU)", group=PARALLEL,
                     aliases=("tensor_parallel_size",))
    pp: int = option(1, "pipeline stages (one process per stage and tp rank; the last stage samples, verifies and "
                     "drafts)", group=PARALLEL, aliases=("pipeline_parallel_size",))
    dist_timeout_s: float = option(120.0, "a collective that waits longer ends the whole tp x pp group with an error",
                                   group=PARALLEL)
    prefix_cache: bool = option(True, "share cached prompt prefixes between requests (radix tree + GDN state "
                                "snapshots)", group=CACHE, aliases=("enable_prefix_caching",),
                                negations=("disable_prefix_cache",))
    prefix_cache_interval: int = option(256, "tokens between GDN state snapshots taken during prefill", group=CACHE)
    prefix_cache_state_share: float | None = option(None, "share of the memory budget held by GDN state snapshots, "
                                                    "the KV pool gets the rest (none: room for 4 snapshots per "
                                                    "request slot, between 0.1 and 0.5 of the budget)", group=CACHE)
    prefix_cache_host_gb: float = option(0.0, "pinned host memory (GiB) that evicted GDN snapshots move to, fetched "
                                         "back on a hit (0: off)", group=CACHE)
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
        set_field(self, "rope_scaling", parse_rope_override(self.rope_scaling))
        if self.quantization in (None, "none"):
            set_field(self, "quantization", None)
        elif self.quantization != "fp8":
            raise ValueError(f"quantization must be one of {list(QUANTIZATION_CHOICES)}, got {self.quantization!r}")
        for name in ("kv_cache_dtype", "draft_kv_cache_dtype"):
            value = getattr(self, name)
            if value not in KV_CACHE_DTYPE_CHOICES:
                raise ValueError(f"{name} must be one of {list(KV_CACHE_DTYPE_CHOICES)}, got {value!r}")
            set_field(self, name, "fp8" if value == "fp8_e4m3" else value)
        if self.mtp_mode in (None, "none"):
            set_field(self, "mtp_mode", None)
            if self.mtp_step or self.mtp_draft_model_dir:
                raise ValueError("mtp_step / mtp_draft_model_dir need mtp_mode (eagle_with_att, vanilla_with_att or "
                                 "draft_model)")
        else:
            set_field(self, "mtp_mode", MtpMode.parse(self.mtp_mode))
            if not self.mtp_step:
                raise ValueError(f"mtp_mode {self.mtp_mode.value} needs mtp_step (draft tokens per step, "
                                 f"1..{MAX_MTP_STEP})")
        if self.mtp_draft_model_dir is not None:
            set_field(self, "mtp_draft_model_dir", str(self.mtp_draft_model_dir))
        if self.mtp_draft_vocab_file is not None:
            set_field(self, "mtp_draft_vocab_file", str(self.mtp_draft_vocab_file))
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
        if self.mem_fraction is not None:
            if not 0.0 < self.mem_fraction <= 1.0:
                raise ValueError(f"mem_fraction must be in (0, 1], got {self.mem_fraction}")
            if device.type != "cuda":
                raise ValueError("mem_fraction sizes the KV pool from the GPU's memory: it needs a CUDA device "
                                 "(on CPU give max_total_token_num, or nothing for max_batch_size x max_model_len)")
        for name in ("max_image_bytes", "max_image_pixels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.limit_mm_per_prompt < 0:
            raise ValueError(f"limit_mm_per_prompt must be >= 0, got {self.limit_mm_per_prompt}")
        if self.allowed_local_media_path is not None:
            root = Path(self.allowed_local_media_path)
            if not root.is_dir():
                raise ValueError(f"allowed_local_media_path {self.allowed_local_media_path} is not a directory")
            set_field(self, "allowed_local_media_path", str(root.resolve()))
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {self.cpu_threads}")

    @property
    def kv_dtype(self) -> torch.dtype:
        """The target's KV pool dtype."""
        return torch.float8_e4m3fn if self.kv_cache_dtype == "fp8" else self.dtype

    @property
    def draft_kv_dtype(self) -> torch.dtype:
        """The MTP draft modules' / draft model's KV pool dtype."""
        return torch.float8_e4m3fn if self.draft_kv_cache_dtype == "fp8" else self.dtype

    @property
    def online_quant(self) -> QuantConfig | None:
        """The block-FP8 format weights are quantized to at load (quantization fp8), else None."""
        return QuantConfig(block=FP8_BLOCK, online=True) if self.quantization == "fp8" else None

    def resolved_cpu_threads(self, hidden_size: int, processes: int) -> int:
        """torch intra-op threads of one engine process on CPU: `cpu_threads` when given; else 1 for a small model
        (its forwards are latency-bound: more threads only add start-up cost, 10x slower on a busy 2-core host),
        else the host's cores shared among the `processes` engine processes on it."""
        if self.cpu_threads is not None:
            return self.cpu_threads
        if hidden_size < SMALL_MODEL_HIDDEN:
            return 1
        return max(1, (os.cpu_count() or 1) // max(1, processes))

    def check_model(self, cfg: ModelConfig) -> int:
        """The checks that need the model's config (the server runs them before starting workers, the engine before
        loading); returns the resolved max_model_len."""
        self.parallel.check_model(cfg)
        if self.mtp_draft_model_dir is not None and not Path(self.mtp_draft_model_dir).is_dir():
            raise ValueError(f"mtp_draft_model_dir {self.mtp_draft_model_dir} is not a directory")
        max_len = self.resolved_max_model_len(cfg)
        if self.max_total_token_num is not None and self.max_total_token_num < max_len:
            raise ValueError(
                f"max_total_token_num {self.max_total_token_num} is below max_model_len {max_len}: a request of "
                "full length could never be admitted; raise it or lower max_model_len"
            )
        return max_len

    def model_config(self) -> ModelConfig:
        """The checkpoint's config with this engine's overrides (rope_scaling; no vision tower where this engine
        serves no images: images_refused_because)."""
        cfg = self.model_config_as_declared()
        if cfg.vision is not None and self.images_refused_because(cfg) is not None:
            return dataclasses.replace(cfg, vision=None)
        return cfg

    def model_config_as_declared(self) -> ModelConfig:
        """The checkpoint's config with rope_scaling, its vision tower kept whether or not this engine serves images."""
        return ModelConfig.from_model_dir(self.model_dir, rope_scaling=self.rope_scaling)

    def images_refused_because(self, cfg: ModelConfig) -> str | None:
        """Why this engine takes no image input (None: it does); `cfg` as the checkpoint declares it."""
        if cfg.vision is None:
            return "this model serves text only (its checkpoint has no vision tower)"
        if self.language_model_only:
            return "this server runs the language model only (--language_model_only): images are not accepted"
        if self.limit_mm_per_prompt == 0:
            return "images are disabled on this server (--limit_mm_per_prompt 0)"
        if self.spec is not None and self.spec.mode is MtpMode.DRAFT_MODEL:
            return "images are not supported with a draft model (mtp_mode draft_model has no M-RoPE input)"
        return None

    def resolved_max_model_len(self, cfg: ModelConfig) -> int:
        """max_model_len, or min(the model's context window, 4096); above the window (max_position_embeddings, or
        with RoPE scaling factor x original_max_position_embeddings) is an error."""
        window = cfg.max_context_len
        if self.max_model_len is None:
            return min(window, 4096)
        if self.max_model_len > window:
            s = cfg.rope_scaling
            if s is None:
                raise ValueError(f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings "
                                 f"{window}; longer contexts need RoPE scaling (--rope_scaling, docs/long_context.md)")
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the scaled context window {window} "
                             f"({s.rope_type} factor {s.factor:g} x original_max_position_embeddings "
                             f"{s.original_max_position_embeddings})")
        return self.max_model_len

    def resolved_kv_pool_size(self, max_model_len: int, lookahead_slots: int = 0) -> int:
        """lookahead_slots: the KV slots a request may hold beyond its tokens (engine/step.kv_lookahead_slots), so
        that the default pool admits max_batch_size requests of max_model_len tokens."""
        return self.max_total_token_num or self.max_batch_size * (max_model_len + lookahead_slots)
