"""TpPartBaseModel: the hybrid (Gated DeltaNet + gated full attention) decoder stack and its caches.

Model packages subclass it and only declare their feed-forward layer class; the base declares the checkpoint
tensors of the stack, loads them through the one loader, owns the KV pool, request slots and linear-attention
state, and runs prefill / decode forwards over a ForwardBatch.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ModelOutput
from lightllm_mtp.common.kv_pool import FP8_KV_DTYPE, KvPool
from lightllm_mtp.common.kv_scales import checkpoint_kv_scales
from lightllm_mtp.common.layers.base import Layer, ModelCaches, Weights
from lightllm_mtp.common.layers.decoder_layer import DecoderLayer
from lightllm_mtp.common.layers.embedding import LMHead, VocabEmbedding, with_input_embeds
from lightllm_mtp.common.layers.gated_attention import GatedAttention
from lightllm_mtp.common.layers.gated_deltanet import GatedDeltaNet
from lightllm_mtp.common.layers.norm import RMSNorm
from lightllm_mtp.common.layers.rope_positions import mrope_axis
from lightllm_mtp.common.linear_att_state import LinearAttState
from lightllm_mtp.common.parallel_state import check_layout, pp_recv_prev, pp_send_next
from lightllm_mtp.common.req_manager import ReqManager
from lightllm_mtp.common.tensor_spec import TensorSpec
from lightllm_mtp.common.weight_loader import load_weights
from lightllm_mtp.config.model_config import LayerType, ModelConfig
from lightllm_mtp.config.runtime import LoadFormat, RuntimeShape
from lightllm_mtp.kernels.norm.rmsnorm import add_rmsnorm
from lightllm_mtp.kernels.attention.rotary import build_rope_cache


class TpPartBaseModel:
    ffn_class: type[Layer]  # declared by each model package

    def __init__(self, model_dir: str | Path | None, cfg: ModelConfig, rt: RuntimeShape, weights: Weights | None = None):
        """Loads `model_dir` through the one loader, or takes already-made `weights` (random-weight benchmarks; the
        dict is consumed: each layer's entries are dropped once the layer is built)."""
        self.cfg = cfg
        self.rt = rt
        if weights is None:
            if model_dir is None:
                raise ValueError("TpPartBaseModel needs a model_dir or weights")
            weights = load_weights(
                model_dir, self.weight_specs(cfg, rt), rt.dtype, rt.device, rt.load_format,
                tp_rank=rt.rank.tp_rank, tp_size=rt.rank.parallel.tp, quant=cfg.quantization, online=rt.online_quant,
            )  # fmt: skip
        self._build(weights)
        self.caches = self._init_caches()
        if model_dir is not None and rt.load_format is LoadFormat.AUTO and rt.kv_pool_dtype == FP8_KV_DTYPE:
            for kv_layer, (k_scale, v_scale) in checkpoint_kv_scales(model_dir, self.attention_prefixes).items():
                self.caches.kv_pool.set_scales(kv_layer, k_scale, v_scale)

    # ---- declaration -------------------------------------------------------------------------------
    @classmethod
    def weight_specs(cls, cfg: ModelConfig, rt: RuntimeShape | None = None) -> list[TensorSpec]:
        """This pipeline stage's tensors (every tensor without rt): its decoder layers, the embedding on the
        first stage (and on the last under MTP: the drafts embed tokens), final norm and lm_head on the last."""
        p = cfg.weight_prefix
        first, last, layers = _stage(cfg, rt)
        specs = []
        if first or (last and (cfg.tie_word_embeddings or (rt is not None and rt.num_draft_tokens > 0))):
            specs += VocabEmbedding.specs(cfg, f"{p}embed_tokens.weight")
        if last:
            specs += RMSNorm.specs(cfg, f"{p}norm.weight") + LMHead.specs(cfg)
        for i in layers:
            layer_type = cfg.layer_types[i]
            prefix = f"{p}layers.{i}."
            mixer_cls, scope = _mixer(layer_type)
            specs += DecoderLayer.norm_specs(cfg, prefix)
            specs += mixer_cls.specs(cfg, f"{prefix}{scope}") + cls.ffn_class.specs(cfg, f"{prefix}mlp.")
        return specs

    def _build(self, weights: Weights) -> None:
        cfg, p = self.cfg, self.cfg.weight_prefix
        self.is_first_stage, self.is_last_stage, self.layer_ids = _stage(cfg, self.rt)
        embed_name = f"{p}embed_tokens.weight"
        self.embed = VocabEmbedding(embed_name, weights) if embed_name in weights else None
        self.final_norm = self.lm_head = None
        if self.is_last_stage:
            self.final_norm = RMSNorm(cfg, f"{p}norm.weight", weights)
            head = self.embed.weight if cfg.tie_word_embeddings else weights["lm_head.weight"]
            self.lm_head = LMHead(head, cfg.vocab_size)
        self.layers: list[DecoderLayer] = []
        self.attention_prefixes: dict[int, str] = {}  # kv layer -> its attention's checkpoint prefix
        kv_layer = state_layer = 0  # this stage's own KV pool layers and GDN state layers
        for i in self.layer_ids:
            layer_type = cfg.layer_types[i]
            prefix = f"{p}layers.{i}."
            mixer_cls, scope = _mixer(layer_type)
            if mixer_cls is GatedAttention:
                mixer: Layer = GatedAttention(cfg, f"{prefix}{scope}", weights, kv_layer=kv_layer)
                self.attention_prefixes[kv_layer] = f"{prefix}{scope}"
                kv_layer += 1
            else:
                mixer = GatedDeltaNet(cfg, f"{prefix}{scope}", weights, state_layer=state_layer)
                state_layer += 1
            ffn = self.ffn_class(cfg, f"{prefix}mlp.", weights)
            self.layers.append(DecoderLayer(cfg, prefix, weights, mixer, ffn))
            for name in [n for n in weights if n.startswith(prefix)]:  # free what the layer fused (e.g. gate_up) now:
                del weights[name]  # the peak stays one layer above the weights (a 27B model fits an 80 GB GPU)

    @property
    def num_kv_layers(self) -> int:
        """This stage's full-attention layers (the first KV pool layers; MTP draft modules own the ones after)."""
        return sum(1 for i in self.layer_ids if self.cfg.layer_types[i] is LayerType.FULL_ATTENTION)

    def _init_caches(self) -> ModelCaches:
        cfg, rt = self.cfg, self.rt
        par = rt.rank.parallel
        nk, nv = par.local_heads(cfg.linear_num_key_heads), par.local_heads(cfg.linear_num_value_heads)
        draft_layers = rt.draft_kv_layers if self.is_last_stage else 0  # the drafts run where the final hidden is
        kv_pool = KvPool(
            self.num_kv_layers, rt.kv_pool_size, par.local_heads(cfg.num_key_value_heads), cfg.head_dim,
            rt.kv_pool_dtype, rt.device, draft_layers=draft_layers, draft_dtype=rt.draft_kv_pool_dtype,
        )  # fmt: skip
        linear_state = LinearAttState(
            num_layers=len(self.layer_ids) - self.num_kv_layers,
            num_slots=rt.max_reqs + 1,
            num_draft_tokens=rt.num_draft_tokens,
            conv_dim=(2 * nk * cfg.linear_key_head_dim + nv * cfg.linear_value_head_dim),
            conv_kernel=cfg.linear_conv_kernel_dim,
            num_value_heads=nv,
            key_head_dim=cfg.linear_key_head_dim,
            value_head_dim=cfg.linear_value_head_dim,
            dtype=rt.dtype,
            device=rt.device,
        )
        # positions past max_model_len: padding rows of verify blocks and draft windows (at most 2k rows from a
        # block start) near the end (ReqManager.padding_columns)
        req_manager = ReqManager(rt.max_reqs, rt.max_model_len, rt.device, linear_state, 2 * rt.num_draft_tokens)
        cos, sin = build_rope_cache(cfg.rotary_dim, req_manager.req_to_token.shape[1], cfg.rope_theta, rt.device,
                                    cfg.rope_scaling)
        rope_delta = axis = None
        if cfg.vision is not None:  # image prompts: M-RoPE grid positions, and a rope delta per request slot after them
            rope_delta = torch.zeros(req_manager.req_to_token.shape[0], dtype=torch.int64, device=rt.device)
            axis = mrope_axis(cfg.vision.mrope_section, rt.device)
        return ModelCaches(kv_pool=kv_pool, req_manager=req_manager, rope_cos=cos, rope_sin=sin,
                           rope_delta=rope_delta, mrope_axis=axis)  # fmt: skip

    # ---- forward -----------------------------------------------------------------------------------
    def forward(self, batch: ForwardBatch) -> ModelOutput:
        """Prefill / chunked prefill / decode; logits and final-norm hidden of batch.b_logits_index rows. Under
        pipeline parallelism a stage receives the residual stream from the one before and hands it to the next;
        only the last stage returns logits and hidden (the others an empty ModelOutput)."""
        if self.rt is not None:  # an engine built before a tp / pp group of another layout joined this process
            check_layout(self.rt.rank)
        received = []
        if not self.is_first_stage:
            rows = batch.positions.shape[0]
            received = pp_recv_prev([(rows, self.cfg.hidden_size)] * 2, self.rt.dtype, self.rt.device)
        out = self.stage_forward(batch, *received)
        if not self.is_last_stage:
            pp_send_next(list(out.to_next_stage))
            return ModelOutput(logits=None, hidden=None)
        return out

    @property
    def num_stage_inputs(self) -> int:
        """Tensors stage_forward takes from the previous stage: none on the first, (delta, residual) after it."""
        return 0 if self.is_first_stage else 2

    def stage_forward(
        self, batch: ForwardBatch, delta: torch.Tensor | None = None, residual: torch.Tensor | None = None
    ) -> ModelOutput:
        """This stage's layers without send / recv (what a stage's CUDA graph captures): from the embedding on the
        first stage, else from the received (delta, residual); the last stage returns logits and hidden, the others
        ModelOutput.to_next_stage."""
        if self.is_first_stage:
            delta, residual = with_input_embeds(self.embed(batch.input_ids), batch.input_embeds), None
        for layer in self.layers:
            delta, residual = layer.forward(delta, residual, batch, self.caches)
        if not self.is_last_stage:
            return ModelOutput(logits=None, hidden=None, to_next_stage=(delta, residual))
        if not batch.keep_all_hidden:
            delta, residual = delta[batch.b_logits_index], residual[batch.b_logits_index]
        hidden, _ = add_rmsnorm(delta, residual, self.final_norm.weight, self.final_norm.eps)
        logits_hidden = hidden[batch.b_logits_index] if batch.keep_all_hidden else hidden
        return ModelOutput(logits=self.lm_head(logits_hidden), hidden=hidden)


def _stage(cfg: ModelConfig, rt: RuntimeShape | None) -> tuple[bool, bool, range]:
    """(first stage, last stage, decoder layer ids) of this process; every layer without rt."""
    if rt is None:
        return True, True, range(cfg.num_hidden_layers)
    info = rt.rank
    return info.is_first_stage, info.is_last_stage, info.parallel.stage_layers(cfg.num_hidden_layers, info.stage)


def _mixer(layer_type: LayerType) -> tuple[type[Layer], str]:
    if layer_type is LayerType.FULL_ATTENTION:
        return GatedAttention, "self_attn."
    return GatedDeltaNet, "linear_attn."
