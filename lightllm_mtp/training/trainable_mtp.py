"""The training-time Qwen3.5 + MTP pair: HF's causal LM and an MTP head in the checkpoint's `mtp.*` structure.

The head computes what the engine's draft (models/mtp_retarget.py) computes for the pair (h_t, x_{t+1}) at position t:
    u = fc(concat[pre_fc_norm_embedding(embed(x_{t+1})), pre_fc_norm_hidden(h_t)]);  h' = mtp.norm(layer(u))
    logits = lm_head(h')  -> x_{t+2}
with h_t the main model's hidden after its final norm, the shared embedding and lm_head, and every norm the
zero-centred (1 + w) RMSNorm of HF's Qwen3.5 (the class of the text model's own final norm).
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from lightllm_mtp.training.published_layout import fuse_experts, mtp_stack, published_model_class, split_experts

_STACK = "stack."  # MtpHead's HF one-layer text model: its layers.* and norm are mtp.layers.* and mtp.norm
_UNUSED = "stack.embed_tokens."  # the stack's own (8-row) embedding: the head reads the main model's


def use_torch_gated_delta_rule() -> None:
    """Make HF's Qwen3.5 GDN layers use transformers' own PyTorch chunked gated delta rule even where fla-core is
    importable: fla-core refuses its chunked backward on Hopper with Triton < 3.7.1 (known wrong results), and
    autograd through the PyTorch form is exact everywhere. Affects this process only."""
    for name in ("qwen3_5.modeling_qwen3_5", "qwen3_5_moe.modeling_qwen3_5_moe"):
        module = importlib.import_module(f"transformers.models.{name}")
        torch_form = inspect.unwrap(module.torch_chunk_gated_delta_rule)
        if torch_form.__module__ != module.__name__:
            raise RuntimeError(f"{module.__name__}.torch_chunk_gated_delta_rule does not wrap the PyTorch form")
        module.torch_chunk_gated_delta_rule = torch_form


class MtpHead(nn.Module):
    def __init__(self, text_config):
        super().__init__()
        h, eps = text_config.hidden_size, text_config.rms_norm_eps
        self.stack = mtp_stack(text_config, 1)
        norm_class = type(self.stack.norm)
        self.pre_fc_norm_embedding = norm_class(h, eps=eps)
        self.pre_fc_norm_hidden = norm_class(h, eps=eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        nn.init.normal_(self.fc.weight, std=text_config.initializer_range)
        self.stack.embed_tokens.weight.requires_grad_(False)

    def forward(self, next_embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """next_embeds = embed(x_{t+1}), hidden = h_t, both [B, T, H] for positions 0..T-1 -> h' [B, T, H]."""
        u = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        return self.stack(inputs_embeds=u).last_hidden_state

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        return {
            "mtp." + name.removeprefix(_STACK): t.detach()
            for name, t in self.state_dict().items()
            if not name.startswith(_UNUSED)
        }


class TinyMtpModel(nn.Module):
    """HF `Qwen3_5(Moe)ForCausalLM` (`lm`) + `MtpHead` (`mtp`), built from a multimodal-wrapper config."""

    def __init__(self, cfg):
        super().__init__()
        import transformers

        text = cfg.text_config
        self.cfg = cfg
        self.lm = getattr(transformers, type(text).__name__.replace("TextConfig", "ForCausalLM"))(text)
        self.mtp = MtpHead(text)
        embed = self.lm.model.embed_tokens
        if embed.padding_idx is not None:  # pad = eos separates documents here: it needs a trained embedding
            with torch.no_grad():
                embed.weight[embed.padding_idx].normal_(0.0, text.initializer_range)
            embed.padding_idx = None

    def forward(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """tokens [B, T + 2]: main logits at positions 0..T-1 predict tokens[:, 1:T+1]; the MTP head at position t
        reads (h_t, tokens[t+1]) and predicts tokens[t+2]. Returns the two mean losses, the MTP head's agreement
        with the main model's next argmax (teacher-forced first-position acceptance) and both logits."""
        inputs, next_tokens, next_next = tokens[:, :-2], tokens[:, 1:-1], tokens[:, 2:]
        hidden = self.lm.model(input_ids=inputs).last_hidden_state  # after the final norm
        main_logits = self.lm.lm_head(hidden)
        mtp_hidden = self.mtp(self.lm.model.embed_tokens(next_tokens), hidden)
        mtp_logits = self.lm.lm_head(mtp_hidden)
        vocab = main_logits.shape[-1]
        with torch.no_grad():
            agree = (mtp_logits[:, :-1].argmax(-1) == main_logits[:, 1:].argmax(-1)).float().mean()
        return {
            "main_loss": F.cross_entropy(main_logits.reshape(-1, vocab).float(), next_tokens.reshape(-1)),
            "mtp_loss": F.cross_entropy(mtp_logits.reshape(-1, vocab).float(), next_next.reshape(-1)),
            "mtp_agree": agree,
            "main_logits": main_logits,
            "mtp_logits": mtp_logits,
        }

    def published_model(self) -> nn.Module:
        """The HF `...ForConditionalGeneration` of the wrapper config holding this language model's weights (the
        vision tower keeps its fresh init), ready for published_layout.write_published_checkpoint."""
        model = published_model_class(self.cfg)(self.cfg)
        model.model.language_model.load_state_dict(self.lm.model.state_dict())
        model.lm_head.load_state_dict(self.lm.lm_head.state_dict())
        return model


@torch.no_grad()
def stream_losses(
    model: TinyMtpModel, stream: torch.Tensor, seq_len: int, num_windows: int, batch_size: int, device, autocast
) -> dict[str, float]:  # fmt: skip
    """Mean main / MTP losses and MTP agreement over the first `num_windows` non-overlapping windows of `stream`
    (leaves the model in eval mode)."""
    model.eval()
    length = seq_len + 2
    windows = stream[: len(stream) // length * length].view(-1, length)[:num_windows]
    if len(windows) == 0:
        raise ValueError(f"a stream of {len(stream)} tokens has no window of {length}")
    sums, count = {"main_loss": 0.0, "mtp_loss": 0.0, "mtp_agree": 0.0}, 0
    for first in range(0, len(windows), batch_size):
        chunk = windows[first : first + batch_size].to(device)
        with autocast():
            out = model(chunk)
        for key in sums:
            sums[key] += out[key].item() * len(chunk)
        count += len(chunk)
    return {key: round(value / count, 4) for key, value in sums.items()}


def load_tiny_mtp_model(model_dir: str | Path) -> TinyMtpModel:
    """A TinyMtpModel (fp32, eval mode) holding a published-layout checkpoint's weights, mtp.* included."""
    from transformers import AutoConfig

    model_dir = Path(model_dir)
    model = TinyMtpModel(AutoConfig.from_pretrained(model_dir))
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(str(model_dir / shard)))
    own = model.state_dict()
    fused = any(name.endswith("experts.gate_up_proj") for name in own)
    tensors = fuse_experts(tensors) if fused else split_experts(tensors)
    mapped = {}
    for name, t in tensors.items():
        if name.startswith("model.language_model."):
            mapped["lm.model." + name.removeprefix("model.language_model.")] = t
        elif name == "lm_head.weight":
            mapped["lm.lm_head.weight"] = t
        elif name in ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"):
            mapped[name] = t
        elif name.startswith("mtp."):
            mapped["mtp." + _STACK + name.removeprefix("mtp.")] = t
    missing = {n for n in own if n not in mapped and not n.startswith("mtp." + _UNUSED)}
    if model.lm.config.tie_word_embeddings:
        missing.discard("lm.lm_head.weight")
    unexpected = set(mapped) - set(own)
    if missing or unexpected:
        raise ValueError(f"{model_dir}: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    model.load_state_dict(mapped, strict=False)
    return model.float().eval()
