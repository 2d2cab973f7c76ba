"""Bytes one decode (or verify) step must move through device memory: the HBM floor of a step.

floor_ms = bytes / measured copy bandwidth. Counted, each once per step:
  * weights: every declared tensor (TensorSpec) read once, except
      - the input embedding: only the rows of the step's tokens (the full matrix when tied, as the lm_head);
      - MoE routed experts (`experts.gate_up_proj` / `experts.down_proj`): only the experts the step's tokens
        select. One token selects exactly top_k per layer; for N tokens under uniform random routing the
        expected number of distinct experts per layer is E * (1 - (1 - k/E)^N) (equals k for N = 1).
  * KV cache: per full-attention layer and request, 2 * Hkv * D * dtype_bytes * context (K and V of every
    cached token, the new one included).
  * Gated DeltaNet state per GDN layer and request: the fp32 SSM state [nv, dk, dv] read once and written once
    per verify row (rows_per_req; 1 for decode), and the conv window [conv_dim, K-1 (+k under MTP)] in the
    model dtype read and written.
Activations, the page table and the logits are left out (small next to the above at these sizes).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from lightllm_mtp.common.tensor_spec import TensorSpec
from lightllm_mtp.config.model_config import ModelConfig

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


def spec_bytes(spec: TensorSpec, dtype: torch.dtype) -> int:
    n = 1
    for d in spec.shape:
        n *= d
    elem = 4 if spec.keep_fp32 else torch.empty((), dtype=dtype).element_size()
    return n * elem


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
) -> StepBytes:
    """Bytes one forward over `batch_size` requests moves; `rows_per_req` new tokens per request (1: decode,
    k+1: MTP verify), `context_len` cached tokens per request after the step (mean over requests)."""
    elem = torch.empty((), dtype=dtype).element_size()
    tokens = batch_size * rows_per_req
    embed_name = f"{cfg.weight_prefix}embed_tokens.weight"
    weights = 0
    embedding_rows = 0
    routed = 0.0
    experts_per_layer = None
    if cfg.moe is not None:
        experts_per_layer = expected_distinct_experts(cfg.moe.num_experts, cfg.moe.num_experts_per_tok, tokens)
    for spec in specs:
        size = spec_bytes(spec, dtype)
        if spec.name == embed_name and not cfg.tie_word_embeddings:
            embedding_rows = min(tokens, cfg.vocab_size) * cfg.hidden_size * elem
        elif spec.name.endswith(ROUTED_EXPERT_SUFFIXES):
            assert cfg.moe is not None and experts_per_layer is not None
            routed += size / cfg.moe.num_experts * experts_per_layer
        else:
            weights += size
    kv_per_token = 2 * cfg.num_key_value_heads * cfg.head_dim * elem * len(cfg.full_attention_layers)
    kv = int(round(kv_per_token * context_len * batch_size))
    ssm = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    conv = cfg.linear_conv_dim * (cfg.linear_conv_kernel_dim - 1 + rows_per_req - 1) * elem
    per_req_layer = ssm * (1 + rows_per_req) + 2 * conv
    linear_state = per_req_layer * len(cfg.linear_attention_layers) * batch_size
    return StepBytes(weights, embedding_rows, routed, kv, linear_state, experts_per_layer)


def floor_ms(num_bytes: float, bandwidth_bytes_per_s: float) -> float:
    return num_bytes / bandwidth_bytes_per_s * 1e3


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
