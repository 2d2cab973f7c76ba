"""The training-time Qwen3.5 + MTP pair: HF's causal LM and an MTP head in the checkpoint's `mtp.*` structure.

The head computes what the engine's draft (models/mtp_retarget.py) computes for the pair (h_t, x_{t+1}) at position t:
    u = fc(concat[pre_fc_norm_embedding(embed(x_{t+1})), pre_fc_norm_hidden(h_t)]);  h' = mtp.norm(layer(u))
    logits = lm_head(h')  -> x_{t+2}
with h_t the main model's hidden after its final norm, the shared embedding and lm_head, and every norm the
zero-centred (1 + w) RMSNorm of HF's Qwen3.5 (the class of the text model's own final norm).

Multi-layer MTP (`num_layers` N > 1; fc, the pre-fc norms and mtp.norm shared, one decoder layer mtp.layers.m per
module), the training convention the engine follows: module m at position t reads (h^{m-1}_t, x_{t+m+1}), h^{-1}
the main model's hidden and h^{m-1} module m-1's output, and predicts x_{t+m+2}.
Parallel drafting (`parallel_drafting`): mask rows after an anchor t read (mtp.mask_hidden, mtp.mask_embedding)
in place of (h, embed(x)); mask row j (position t + j) predicts x_{t+j+2}, attending to the rows up to t and the
mask rows before it.
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

from lightllm_mtp.config.spec_config import MAX_MTP_STEP
from lightllm_mtp.tools.published_layout import fuse_experts, mtp_stack, published_model_class, split_experts



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
    def __init__(self, text_config, num_layers: int = 1, parallel_drafting: bool = False):
        super().__init__()
        h, eps = text_config.hidden_size, text_config.rms_norm_eps
        self.stacks = nn.ModuleList(mtp_stack(text_config, 1) for _ in range(num_layers))
        for stack in self.stacks[1:]:
            stack.norm = self.stacks[0].norm  # mtp.norm is shared
        norm_class = type(self.stacks[0].norm)
        self.pre_fc_norm_embedding = norm_class(h, eps=eps)
        self.pre_fc_norm_hidden = norm_class(h, eps=eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        nn.init.normal_(self.fc.weight, std=text_config.initializer_range)
        for stack in self.stacks:
            stack.embed_tokens.weight.requires_grad_(False)
        self.mask_embedding = self.mask_hidden = None
        if parallel_drafting:
            self.mask_embedding = nn.Parameter(torch.randn(h) * text_config.initializer_range)
            self.mask_hidden = nn.Parameter(torch.randn(h))

    def fused_input(self, next_embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))

    def forward(self, next_embeds: torch.Tensor, hidden: torch.Tensor, module: int = 0) -> torch.Tensor:
        """next_embeds = embed(x_{t+m+1}), hidden = h^{m-1}_t, both [B, T, H] for positions 0..T-1 -> h^m [B, T, H]
        (module m = `module`)."""
        return self.stacks[module](inputs_embeds=self.fused_input(next_embeds, hidden)).last_hidden_state

    def masked_forward(self, context: torch.Tensor, num_masks: int) -> torch.Tensor:
        """context: fused inputs [B, t+1, H] of positions 0..t -> h' of `num_masks` mask rows after them."""
        mask = self.fused_input(self.mask_embedding, self.mask_hidden).expand(context.shape[0], num_masks, -1)
        rows = torch.cat([context, mask], dim=1)
        return self.stacks[0](inputs_embeds=rows).last_hidden_state[:, -num_masks:]

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, t in self.state_dict().items():
            if name.startswith("stacks."):
                module, rest = name.removeprefix("stacks.").split(".", 1)
                if rest.startswith("layers.0."):
                    out[f"mtp.layers.{module}." + rest.removeprefix("layers.0.")] = t.detach()
                elif rest.startswith("norm.") and module == "0":
                    out["mtp." + rest] = t.detach()
            else:
                out["mtp." + name] = t.detach()
        return out


class TinyMtpModel(nn.Module):
    """HF `Qwen3_5(Moe)ForCausalLM` (`lm`) + `MtpHead` (`mtp`), built from a multimodal-wrapper config."""

    def __init__(self, cfg, parallel_drafting: bool = False, num_masks: int = 0, anchors: int = 0):
        """parallel_drafting: also train mask rows, `num_masks` after each of `anchors` random positions per
        batch."""
        super().__init__()
        import transformers

        text = cfg.text_config
        self.cfg = cfg
        self.num_mtp_layers = text.mtp_num_hidden_layers
        self.num_masks, self.anchors = num_masks, anchors
        self.lm = getattr(transformers, type(text).__name__.replace("TextConfig", "ForCausalLM"))(text)
        self.mtp = MtpHead(text, self.num_mtp_layers, parallel_drafting)
        embed = self.lm.model.embed_tokens
        if embed.padding_idx is not None:  # pad = eos separates documents here: it needs a trained embedding
            with torch.no_grad():
                embed.weight[embed.padding_idx].normal_(0.0, text.initializer_range)
            embed.padding_idx = None

    @property
    def window_extra(self) -> int:
        """Tokens a training window carries past its T input positions: the labels of the furthest module or mask
        row."""
        return max(self.num_mtp_layers, self.num_masks) + 1

    def forward(self, tokens: torch.Tensor, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """tokens [B, T + window_extra]: main logits at positions 0..T-1 predict tokens[:, 1:T+1]; MTP module m at
        position t reads (h^{m-1}_t, tokens[t+m+1]) and predicts tokens[t+m+2]. Returns the mean losses (mtp_loss:
        module 0; mtp_loss_m: module m; ptd_loss: the mask rows), the MTP head's agreement with the main model's
        next argmax (teacher-forced first-position acceptance) and the main and module-0 logits."""
        length = tokens.shape[1] - self.window_extra
        inputs = tokens[:, :length]
        hidden = self.lm.model(input_ids=inputs).last_hidden_state  # after the final norm
        main_logits = self.lm.lm_head(hidden)
        vocab = main_logits.shape[-1]
        embed = self.lm.model.embed_tokens
        out = {"main_loss": F.cross_entropy(main_logits.reshape(-1, vocab).float(), tokens[:, 1 : length + 1].reshape(-1))}
        mtp_hidden, mtp_logits = hidden, None
        for m in range(self.num_mtp_layers):
            mtp_hidden = self.mtp(embed(tokens[:, m + 1 : m + 1 + length]), mtp_hidden, module=m)
            logits = self.lm.lm_head(mtp_hidden)
            labels = tokens[:, m + 2 : m + 2 + length]
            out["mtp_loss" if m == 0 else f"mtp_loss_{m}"] = F.cross_entropy(logits.reshape(-1, vocab).float(),
                                                                               labels.reshape(-1))  # fmt: skip
            if m == 0:
                mtp_logits = logits
        if self.mtp.mask_embedding is not None:
            out["ptd_loss"] = self._masked_loss(tokens, hidden, length, generator)
        with torch.no_grad():
            out["mtp_agree"] = (mtp_logits[:, :-1].argmax(-1) == main_logits[:, 1:].argmax(-1)).float().mean()
        out["main_logits"], out["mtp_logits"] = main_logits, mtp_logits
        return out

    def _masked_loss(self, tokens, hidden, length, generator) -> torch.Tensor:
        """Mask rows after `anchors` random positions t (the same t for the whole batch): the context rows 0..t
        are module 0's teacher-forced inputs; mask row j predicts tokens[t + j + 2]."""
        context = self.mtp.fused_input(self.lm.model.embed_tokens(tokens[:, 1 : length + 1]), hidden)
        losses = []
        for t in torch.randint(0, length, (self.anchors,), generator=generator).tolist():
            mask_hidden = self.mtp.masked_forward(context[:, : t + 1], self.num_masks)
            logits = self.lm.lm_head(mask_hidden)
            labels = tokens[:, t + 2 : t + 2 + self.num_masks]
            losses.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1)))
        return torch.stack(losses).mean()

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
    length = seq_len + model.window_extra
    windows = stream[: len(stream) // length * length].view(-1, length)[:num_windows]
    if len(windows) == 0:
        raise ValueError(f"a stream of {len(stream)} tokens has no window of {length}")
    sums, count = {}, 0
    anchors = torch.Generator().manual_seed(0)  # the same mask-row anchors at every evaluation
    for first in range(0, len(windows), batch_size):
        chunk = windows[first : first + batch_size].to(device)
        with autocast():
            out = model(chunk, anchors)
        for key, value in out.items():
            if value.ndim == 0:
                sums[key] = sums.get(key, 0.0) + value.item() * len(chunk)
        count += len(chunk)
    return {key: round(value / count, 4) for key, value in sums.items()}


def load_tiny_mtp_model(model_dir: str | Path) -> TinyMtpModel:
    """A TinyMtpModel (fp32, eval mode) holding a published-layout checkpoint's weights, mtp.* included."""
    from transformers import AutoConfig

    model_dir = Path(model_dir)
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    ptd = "mtp.mask_embedding" in index["weight_map"]
    masks = MAX_MTP_STEP - 1 if ptd else 0
    model = TinyMtpModel(AutoConfig.from_pretrained(model_dir), ptd, num_masks=masks, anchors=4 if ptd else 0)
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
        elif name.startswith("mtp.layers."):
            module, rest = name.removeprefix("mtp.layers.").split(".", 1)
            mapped[f"mtp.stacks.{module}.layers.0.{rest}"] = t
        elif name == "mtp.norm.weight":
            for m in range(model.num_mtp_layers):  # one shared norm
                mapped[f"mtp.stacks.{m}.norm.weight"] = t
        elif name.startswith("mtp."):
            mapped[name] = t
    unused = lambda n: n.startswith("mtp.stacks.") and ".embed_tokens." in n  # noqa: E731 (the stacks' own)
    missing = {n for n in own if n not in mapped and not unused(n)}
    if model.lm.config.tie_word_embeddings:
        missing.discard("lm.lm_head.weight")
    unexpected = set(mapped) - set(own)
    if missing or unexpected:
        raise ValueError(f"{model_dir}: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    model.load_state_dict(mapped, strict=False)
    return model.float().eval()
