"""The shared weight-retarget mixin of the MTP draft packages.

A Qwen3.5 MTP head is one full-attention decoder layer stored under `mtp.` in the main checkpoint (or in
`--mtp_draft_model_dir`). The mixin retargets those names (`mtp.fc`, `mtp.pre_fc_norm_*`,
`mtp.layers.{j}.*`, `mtp.norm`) onto the engine's shared layer classes, shares embedding, lm_head, request
and KV managers and rope caches with the main model by reference, and owns one KV layer of the pool.

Forward for the pair (h_t, x_{t+1}) at position t:
    u = fc(concat[norm_e(embed(x_{t+1})), norm_h(h_t)]);  u = decoder_layer(u);  h' = mtp.norm(u)
    logits = lm_head(h')  -> predicts x_{t+2}; h' is the hidden fed to the next eagle step.
Parallel drafting: a row whose input id is -1 is a mask row; `mtp.mask_embedding` replaces embed(x_{t+1}) there
(the proposer feeds `mtp.mask_hidden` as its h_t).
"""

from __future__ import annotations

from pathlib import Path

import torch

from lightllm_mtp.common.basemodel.basemodel import TpPartBaseModel
from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ModelOutput
from lightllm_mtp.common.layers.base import Layer
from lightllm_mtp.common.layers.decoder_layer import DecoderLayer
from lightllm_mtp.common.layers.embedding import LMHead, with_input_embeds
from lightllm_mtp.common.layers.gated_attention import GatedAttention
from lightllm_mtp.common.kv_scales import checkpoint_kv_scales
from lightllm_mtp.common.layers.norm import RMSNorm
from lightllm_mtp.common.tensor_spec import TensorSpec
from lightllm_mtp.common.weight_loader import WeightLoadError, load_weights, shard_index
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.config.runtime import LoadFormat
from lightllm_mtp.kernels.linear.gemv import linear
from lightllm_mtp.kernels.norm.rmsnorm import add_rmsnorm


_MASK_TENSORS = ("mtp.mask_embedding", "mtp.mask_hidden")


class MtpWeightRetargetMixin:
    ffn_class: type[Layer]  # declared by each draft package

    def __init__(
        self,
        main: TpPartBaseModel,
        model_dir: str | Path,
        mtp_layer: int,
        kv_layer: int,
        parallel_drafting: bool = False,
        lm_head: LMHead | None = None,
    ):
        """lm_head: a reduced draft vocabulary's rows of the main lm_head (logits index that subset); None: the
        main model's."""
        cfg = self.cfg = main.cfg
        if cfg.mtp_num_hidden_layers <= mtp_layer:
            raise ValueError(
                f"MTP needs mtp.layers.{mtp_layer} but the config declares mtp_num_hidden_layers="
                f"{cfg.mtp_num_hidden_layers}"
            )
        dummy = main.rt.load_format is LoadFormat.DUMMY
        if not dummy and "mtp.fc.weight" not in shard_index(Path(model_dir)):
            raise WeightLoadError(
                f"{model_dir}: checkpoint has no MTP weights (mtp.fc.weight and the other mtp.* tensors); "
                "MTP speculative decoding needs a checkpoint that ships its MTP head"
            )
        specs = self.weight_specs(cfg, mtp_layer)
        if parallel_drafting:
            index = {} if dummy else shard_index(Path(model_dir))
            missing = [name for name in _MASK_TENSORS if not dummy and name not in index]
            if missing:
                raise WeightLoadError(
                    f"{model_dir}: parallel drafting needs the trained mask inputs {', '.join(missing)}; this "
                    "checkpoint has none (train one with `train_tiny --ptd`, or drop --parallel_drafting)"
                )
            specs += [TensorSpec(name, (cfg.hidden_size,)) for name in _MASK_TENSORS]
        rank = main.rt.rank
        weights = load_weights(model_dir, specs, main.rt.dtype, main.rt.device, main.rt.load_format, 1 + mtp_layer,
                               tp_rank=rank.tp_rank, tp_size=rank.parallel.tp, quant=cfg.quantization,
                               online=main.rt.online_quant)  # sharded and stored like the main model  # fmt: skip
        self.mask_embedding = weights.get("mtp.mask_embedding")  # [H] or None
        self.mask_hidden = weights.get("mtp.mask_hidden")  # [H] or None
        self.embed, self.caches = main.embed, main.caches
        self.lm_head = lm_head if lm_head is not None else main.lm_head
        self.fc = weights["mtp.fc.weight"]  # [H, 2H]: input is [embedding part | hidden part]
        self.norm_embedding = RMSNorm(cfg, "mtp.pre_fc_norm_embedding.weight", weights)
        self.norm_hidden = RMSNorm(cfg, "mtp.pre_fc_norm_hidden.weight", weights)
        self.final_norm = RMSNorm(cfg, "mtp.norm.weight", weights)
        prefix = f"mtp.layers.{mtp_layer}."
        attention = GatedAttention(cfg, f"{prefix}self_attn.", weights, kv_layer=kv_layer)
        if not dummy and main.caches.kv_pool.is_fp8(kv_layer):  # FP8 draft KV (draft_kv_cache_dtype fp8)
            for layer, scales in checkpoint_kv_scales(model_dir, {kv_layer: f"{prefix}self_attn."}).items():
                main.caches.kv_pool.set_scales(layer, *scales)
        self.layer = DecoderLayer(cfg, prefix, weights, attention, self.ffn_class(cfg, f"{prefix}mlp.", weights))

    @classmethod
    def weight_specs(cls, cfg: ModelConfig, mtp_layer: int) -> list[TensorSpec]:
        """The tensors of MTP module `mtp_layer` (the shared fc, norms, and its decoder layer)."""
        prefix = f"mtp.layers.{mtp_layer}."
        h = cfg.hidden_size
        return [
            TensorSpec("mtp.fc.weight", (h, 2 * h)),
            *RMSNorm.specs(cfg, "mtp.pre_fc_norm_embedding.weight"),
            *RMSNorm.specs(cfg, "mtp.pre_fc_norm_hidden.weight"),
            *RMSNorm.specs(cfg, "mtp.norm.weight"),
            *DecoderLayer.norm_specs(cfg, prefix),
            *GatedAttention.specs(cfg, f"{prefix}self_attn."),
            *cls.ffn_class.specs(cfg, f"{prefix}mlp."),
        ]

    def forward(self, batch: ForwardBatch, main_hidden: torch.Tensor) -> ModelOutput:
        """main_hidden [T, H]: the target's final-norm hidden (or the previous eagle step's h') per row.
        Returns logits of batch.b_logits_index rows and h' of ALL rows."""
        ids = batch.input_ids
        e = self.embed(ids.clamp_min(0)) if self.mask_embedding is not None else self.embed(ids)
        if self.mask_embedding is not None:
            e = torch.where((ids < 0)[:, None], self.mask_embedding, e)
        e = self.norm_embedding(with_input_embeds(e, batch.input_embeds))  # vision embeddings at image tokens
        u = linear(torch.cat([e, self.norm_hidden(main_hidden)], dim=-1), self.fc)
        delta, residual = self.layer.forward(u, None, batch, self.caches)
        hidden, _ = add_rmsnorm(delta, residual, self.final_norm.weight, self.final_norm.eps)
        return ModelOutput(logits=self.lm_head(hidden[batch.b_logits_index]), hidden=hidden)
