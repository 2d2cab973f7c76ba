"""Bytes one decode (or verify) step must move through device memory: the HBM floor of a step.

floor_ms = bytes / measured copy bandwidth. Counted, each once per step:
  * weights: every declared tensor (TensorSpec) read once as stored (block-FP8 projections: one byte an element
    plus their fp32 block scales, under the checkpoint's quantization_config or online FP8), except
      - the input embedding: only the rows of the step's tokens (the full matrix when tied, as the lm_head);
      - MoE routed experts (`experts.gate_up_proj` / `experts.down_proj`): only the experts the step's tokens
        select. One token selects exactly top_k per layer; for N tokens under uniform random routing the
        expected number of distinct experts per layer is E * (1 - (1 - k/E)^N) (equals k for N = 1).
  * KV cache: per full-attention layer and request, 2 * Hkv * D * kv_dtype_bytes * context (K and V of every
    cached token, the new one included; 1 byte an element with an FP8 KV cache).
  * Gated DeltaNet state per GDN layer and request: the fp32 SSM state [nv, dk, dv] read once and written once
    per verify row (rows_per_req; 1 for decode), and the conv window [conv_dim, K-1 (+k under MTP)] in the
    model dtype read and written.
Activations, the page table and the logits are left out (small next to the above at these sizes).

Under tensor / pipeline parallelism (`stage_bytes`) the count is one GPU's: its stage's tensors at its tp shard's
shape, its stage's layers' KV and GDN state at its local heads (KV and GDN key heads replicate when there are fewer
than ranks), and of the vocab-sharded input embedding 1/tp of the step's rows (their expected share).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch

from lightllm_mtp.common.quantization import methods
from lightllm_mtp.common.tensor_spec import TensorSpec
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.config.quant_config import QuantConfig
from lightllm_mtp.config.parallel_config import ParallelConfig, RankInfo
from lightllm_mtp.config.runtime import RuntimeShape

ROUTED_EXPERT_SUFFIXES = ("experts.gate_up_proj", "experts.down_proj")


@dataclass(frozen=True)
class StepBytes:
    weights: int  # everything read once: lm_head, attention, GDN, norms, dense MLP / router / shared expert
    embedding_rows: int  # input-embedding rows of the step's tokens (0 when tied: the lm_head reads it all)
    routed_experts: float  # expected bytes of the distinct routed experts hit (MoE only)
    kv_cache: int  # K and V of the whole context, every full-attention layer, every request
    linear_state: int  # GDN SSM state read + written, conv window read + written
    experts_per_layer: float | None  # expected distinct routed experts per MoE layer (None: dense)

    @property
    def total(self) -> float:
        return self.weights + self.embedding_rows + self.routed_experts + self.kv_cache + self.linear_state

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def spec_bytes(spec: TensorSpec, dtype: torch.dtype, tp: int = 1, quant: QuantConfig | None = None) -> int:
    """Bytes of the tensor as stored, or of one tp rank's shard of it."""
    return methods.spec_bytes(spec, dtype, quant, tp)


def expected_distinct_experts(num_experts: int, top_k: int, num_tokens: int) -> float:
    """E * (1 - (1 - k/E)^N): expected distinct experts hit by N tokens routed uniformly at random, k each."""
    if num_tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** num_tokens)


def step_bytes(
    cfg: ModelConfig,
    specs: list[TensorSpec],
    dtype: torch.dtype,
    batch_size: int,
    context_len: float,
    rows_per_req: int = 1,
    *,
    tp: int = 1,
    layer_ids: Iterable[int] | None = None,
    first_stage: bool = True,
    last_stage: bool = True,
    quant: QuantConfig | None = None,
    kv_dtype: torch.dtype | None = None,
) -> StepBytes:
    """Bytes one forward over `batch_size` requests moves; `rows_per_req` new tokens per request (1: decode,
    k+1: MTP verify), `context_len` cached tokens per request after the step (mean over requests). One GPU's share
    with tp > 1 or `layer_ids` (a pipeline stage's layers; `specs` then that stage's tensors): see stage_bytes. The
    input embedding's rows are read on the first stage; a tied matrix is read whole by the lm_head on the last (an
    MTP draft's embedding on the last stage is not the forward's). quant: how the projections are stored (default the
    checkpoint's quantization_config; online FP8: pass it); kv_dtype: the KV cache's (default the model dtype)."""
    elem = torch.empty((), dtype=dtype).element_size()
    kv_elem = torch.empty((), dtype=kv_dtype or dtype).element_size()
    quant = quant or cfg.quantization
    tokens = batch_size * rows_per_req
    layers = set(range(cfg.num_hidden_layers) if layer_ids is None else layer_ids)
    embed_name = f"{cfg.weight_prefix}embed_tokens.weight"
    weights = 0
    embedding_rows = 0
    routed = 0.0
    experts_per_layer = None
    if cfg.moe is not None:
        experts_per_layer = expected_distinct_experts(cfg.moe.num_experts, cfg.moe.num_experts_per_tok, tokens)
    for spec in specs:
        size = spec_bytes(spec, dtype, tp, quant)
        if spec.name == embed_name:
            if cfg.tie_word_embeddings and last_stage:
                weights += size  # the lm_head's matrix (the rows looked up are in it)
            elif first_stage:
                embedding_rows = min(tokens, cfg.vocab_size) * cfg.hidden_size * elem // tp
        elif spec.name.endswith(ROUTED_EXPERT_SUFFIXES):
            assert cfg.moe is not None and experts_per_layer is not None
            routed += size / cfg.moe.num_experts * experts_per_layer
        else:
            weights += size
    kv_heads = max(1, cfg.num_key_value_heads // tp)
    kv_layers = sum(1 for i in cfg.full_attention_layers if i in layers)
    kv = int(round(2 * kv_heads * cfg.head_dim * kv_elem * kv_layers * context_len * batch_size))
    nk, nv = max(1, cfg.linear_num_key_heads // tp), cfg.linear_num_value_heads // tp
    ssm = nv * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    conv_dim = 2 * nk * cfg.linear_key_head_dim + nv * cfg.linear_value_head_dim
    conv = conv_dim * (cfg.linear_conv_kernel_dim - 1 + rows_per_req - 1) * elem
    per_req_layer = ssm * (1 + rows_per_req) + 2 * conv
    linear_state = per_req_layer * sum(1 for i in cfg.linear_attention_layers if i in layers) * batch_size
    return StepBytes(weights, embedding_rows, routed, kv, linear_state, experts_per_layer)


def stage_bytes(
    cfg: ModelConfig,
    model_cls,
    dtype: torch.dtype,
    batch_size: int,
    context_len: float,
    rows_per_req: int = 1,
    *,
    tp: int = 1,
    pp: int = 1,
    quant: QuantConfig | None = None,
    kv_dtype: torch.dtype | None = None,
) -> list[StepBytes]:
    """One GPU's bytes per pipeline stage (tp rank 0 of each; the tp ranks of a stage read alike). The stages run
    one after another within a step, the tp ranks of a stage side by side: the step's floor on GPUs of bandwidth BW
    is sum(stage totals) / BW. model_cls: the model class (its weight_specs classmethod declares a stage's tensors)."""
    parallel = ParallelConfig(tp=tp, pp=pp)
    out = []
    for stage in range(pp):
        rt = RuntimeShape(dtype=dtype, device=torch.device("cpu"), max_reqs=1, max_model_len=1, kv_pool_size=1,
                          rank=RankInfo(parallel, rank=stage * tp))  # fmt: skip
        specs = model_cls.weight_specs(cfg, rt)
        out.append(step_bytes(cfg, specs, dtype, batch_size, context_len, rows_per_req, tp=tp,
                              layer_ids=parallel.stage_layers(cfg.num_hidden_layers, stage), first_stage=stage == 0,
                              last_stage=stage == pp - 1, quant=quant, kv_dtype=kv_dtype))  # fmt: skip
    return out


def floor_ms(num_bytes: float, bandwidth_bytes_per_s: float) -> float:
    return num_bytes / bandwidth_bytes_per_s * 1e3


def parallel_floor(
    cfg: ModelConfig,
    model_cls,
    dtype: torch.dtype,
    batch_size: int,
    context_len: float,
    step_ms: float,
    bandwidth_bytes_per_s: float,
    rows_per_req: int = 1,
    *,
    tp: int,
    pp: int,
    quant: QuantConfig | None = None,
    kv_dtype: torch.dtype | None = None,
) -> dict:
    """The floor of a tp x pp step on GPUs of one bandwidth: each stage's GPU bytes (stage_bytes) over the
    bandwidth, summed over the stages; with each GPU's busy share of the measured step (its stage's floor / step)."""
    stages = stage_bytes(cfg, model_cls, dtype, batch_size, context_len, rows_per_req, tp=tp, pp=pp, quant=quant,
                         kv_dtype=kv_dtype)
    stage_ms = [floor_ms(s.total, bandwidth_bytes_per_s) for s in stages]
    total = sum(stage_ms)
    return {
        "tp": tp,
        "pp": pp,
        "stage_bytes_per_gpu": [s.total for s in stages],
        "stage_floor_ms": stage_ms,
        "floor_ms": total,
        "pct_of_floor": total / step_ms * 100.0,
        "gpu_busy_pct": [m / step_ms * 100.0 for m in stage_ms],
    }


def prefill_gemm_flops(cfg: ModelConfig, specs: list[TensorSpec], tokens: int) -> float:
    """Matmul FLOPs of a prefill over `tokens` prompt tokens: 2 * tokens * the weight elements each token multiplies
    (every 2-D projection; of the routed experts top_k / E; no embedding, no lm_head: logits of one row per request;
    no norms, depthwise conv or attention scores). The prefill floor is this at the measured bf16 matmul peak."""
    embed = f"{cfg.weight_prefix}embed_tokens.weight"
    per_token = 0.0
    for spec in specs:
        if spec.name == embed or spec.name.endswith("lm_head.weight") or len(spec.shape) < 2:
            continue
        n = math.prod(spec.shape)
        if spec.name.endswith(ROUTED_EXPERT_SUFFIXES):
            assert cfg.moe is not None
            per_token += n * cfg.moe.num_experts_per_tok / cfg.moe.num_experts
        elif len(spec.shape) == 2:
            per_token += n
    return 2.0 * tokens * per_token


def stored(args, cfg: ModelConfig) -> dict:
    """step_bytes' quant / kv_dtype for a benchmark's args: the checkpoint's quantization_config (an -fp8 shape) or
    online FP8 (`quantization fp8`); the KV cache's dtype (`kv_cache_dtype fp8`: one byte an element)."""
    online = QuantConfig(online=True) if getattr(args, "quantization", "none") == "fp8" else None
    kv_fp8 = getattr(args, "kv_cache_dtype", "auto") == "fp8"
    return dict(quant=cfg.quantization or online, kv_dtype=torch.float8_e4m3fn if kv_fp8 else None)
