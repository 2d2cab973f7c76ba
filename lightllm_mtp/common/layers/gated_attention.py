"""Qwen3.5 gated full attention: per-head [query | gate] q_proj, (1+w) q/k RMSNorm, partial RoPE,
GQA over the paged KV pool, sigmoid output gate."""

from __future__ import annotations

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode
from lightllm_mtp.common.layers.base import Layer, ModelCaches, Weights
from lightllm_mtp.common.layers.rope_positions import rope_inputs
from lightllm_mtp.common.quantization.linear import Linear
from lightllm_mtp.common.tensor_spec import TensorSpec, TpShard
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.kernels.attention.decode_attention import decode_attention
from lightllm_mtp.kernels.attention.output_gate import sigmoid_gate_mul
from lightllm_mtp.kernels.attention.prefill_attention import prefill_attention
from lightllm_mtp.kernels.attention.qk_norm_rope import qk_norm_rope_store_kv


class GatedAttention(Layer):
    def __init__(self, cfg: ModelConfig, prefix: str, weights: Weights, kv_layer: int):
        self.kv_layer = kv_layer
        self.head_dim = cfg.head_dim
        self.has_gate = cfg.attn_output_gate
        self.eps = cfg.rms_norm_eps
        self.scale = cfg.head_dim**-0.5
        names = [f"{prefix}{n}_proj.weight" for n in "qkv"]
        q, k, v = (weights[n] for n in names)
        self.q_size = q.shape[0]
        self.kv_size = k.shape[0]
        # this tp rank's heads (column-parallel q/k/v by head, row-parallel o_proj: the caller all-reduces)
        self.num_heads = self.q_size // (self.head_dim * (2 if self.has_gate else 1))
        self.num_kv_heads = self.kv_size // self.head_dim
        self.qkv_proj = Linear.fused(weights, names)  # [(Hq*D*(1+gate)) + 2*Hkv*D, H]
        self.o_proj = Linear(weights[f"{prefix}o_proj.weight"], [f"{prefix}o_proj.weight"])
        self.q_norm = weights[f"{prefix}q_norm.weight"]
        self.k_norm = weights[f"{prefix}k_norm.weight"]

    @classmethod
    def specs(cls, cfg: ModelConfig, prefix: str) -> list[TensorSpec]:
        h, d = cfg.hidden_size, cfg.head_dim
        q_rows = cfg.num_attention_heads * d * (2 if cfg.attn_output_gate else 1)
        kv = TpShard(0, heads=(cfg.num_key_value_heads,))  # replicated when tp > KV heads
        return [
            TensorSpec(f"{prefix}q_proj.weight", (q_rows, h), tp=TpShard(0), quantizable=True),
            TensorSpec(f"{prefix}k_proj.weight", (cfg.num_key_value_heads * d, h), tp=kv, quantizable=True),
            TensorSpec(f"{prefix}v_proj.weight", (cfg.num_key_value_heads * d, h), tp=kv, quantizable=True),
            TensorSpec(f"{prefix}o_proj.weight", (h, cfg.num_attention_heads * d), tp=TpShard(1), quantizable=True),
            TensorSpec(f"{prefix}q_norm.weight", (d,)),
            TensorSpec(f"{prefix}k_norm.weight", (d,)),
        ]

    def forward(self, x: torch.Tensor, batch: ForwardBatch, caches: ModelCaches) -> torch.Tensor:
        t = x.shape[0]
        q_all, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.has_gate:
            # each head's rows are [query(D) | gate(D)]; both stay views of the projection (the kernels take strides)
            q, gate = q_all.view(t, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        else:
            q, gate = q_all.view(t, self.num_heads, self.head_dim), None
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        k_buffer, v_buffer = caches.kv_pool.layer(self.kv_layer)
        k_scale, v_scale = caches.kv_pool.scales(self.kv_layer)  # an FP8 pool: K = stored * k_scale; else 1.0
        # q/k norm, partial RoPE, and the new K/V into the pool at batch.mem_index: one launch
        positions, cos, sin = rope_inputs(batch, caches.rope_cos, caches.rope_sin, caches.rope_delta, caches.mrope_axis)
        q = qk_norm_rope_store_kv(
            q, k, v, self.q_norm, self.k_norm, self.eps, positions, cos, sin,
            k_buffer=k_buffer, v_buffer=v_buffer, mem_index=batch.mem_index, k_scale=k_scale, v_scale=v_scale,
        )
        req_to_token = caches.req_manager.req_to_token
        if batch.mode is ForwardMode.DECODE:  # EXTEND and VERIFY are both ragged causal blocks
            o = decode_attention(q, k_buffer, v_buffer, req_to_token, batch.b_req_idx, batch.b_seq_len, self.scale,
                                 k_scale=k_scale, v_scale=v_scale)  # fmt: skip
        else:
            o = prefill_attention(
                q, k_buffer, v_buffer, req_to_token, batch.b_req_idx, batch.b1_cu_q_len, batch.b_seq_len, self.scale,
                max_q_len=batch.max_q_len, k_scale=k_scale, v_scale=v_scale,
            )
        if gate is not None:
            o = sigmoid_gate_mul(o, gate)
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))
