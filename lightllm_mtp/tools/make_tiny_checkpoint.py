"""Build a tiny, seeded Qwen3.5 (dense or MoE) checkpoint in the published multimodal layout.

    python -m lightllm_mtp.tools.make_tiny_checkpoint --arch qwen3_5_moe --out /tmp/tiny_moe --mtp_layers 2

Writes config.json (text fields under text_config, tiny vision tower), generation_config.json, float32 safetensors
shards + index (model.language_model.*, lm_head.weight unless tied, model.visual.*, mtp.*) and a byte-level BPE
tokenizer trained on the Python standard library. The main model is made and saved by transformers' own classes;
mtp.* follows the same naming (and MoE expert layout). Same seed, byte-identical files.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from lightllm_mtp.tools.published_layout import (
    mtp_stack,
    padded_vocab_size,
    published_model_class,
    write_published_checkpoint,
)
from lightllm_mtp.tools.tiny_recipe import (
    ARCHS,
    DRAFT_SIZES,
    INIT_STD,
    SPECIAL_TOKENS,
    make_config,
    train_tokenizer,
)

SHARD_BYTES = 512 * 1024
HEAD_STD = 0.25  # lm_head (or tied embedding) std, large enough for clear greedy logit margins
ROUTER_STD = 0.3  # MoE router: spread-out expert scores, so top-k near-ties (selection flips on rounding) are rare
NORM_STD = 0.1  # noise on the zero-centred (1 + w) RMSNorm weights and on the GDN gated norm around 1


@torch.no_grad()
def _perturb(model: torch.nn.Module) -> None:
    """Move norms and GDN decay parameters off their trivial init (uses the global, seeded RNG)."""
    for module in model.modules():
        kind = type(module).__name__
        if kind.endswith("RMSNorm") and "Vision" not in kind:
            module.weight.normal_(0.0, NORM_STD)  # zero-centred: scale is 1 + w
        elif kind.endswith("RMSNormGated"):
            module.weight.normal_(1.0, NORM_STD)  # plain weight
        elif kind.endswith("TopKRouter"):
            module.weight.normal_(0.0, ROUTER_STD)
        elif isinstance(module, torch.nn.Embedding) and module.padding_idx is not None:
            module.weight[module.padding_idx].normal_(0.0, INIT_STD)  # HF zeroes the pad (= eos) row
        elif kind.endswith("GatedDeltaNet"):
            # Mild decay (g = -A * softplus(a + dt_bias) mostly in [-1.5, 0)): memory over tens of tokens, and
            # small in-chunk cumulative sums of g, which keeps chunked and recurrent forms within ~1e-4 in fp32.
            module.A_log.copy_(torch.empty_like(module.A_log).uniform_(0.1, 1.0).log())
            module.dt_bias.uniform_(-1.0, 1.0)
            module.in_proj_a.weight.mul_(0.25)


def _mtp_tensors(cfg, mtp_layers: int, ptd: bool = False) -> dict[str, torch.Tensor]:
    """mtp.* weights: fc, the three norms, and N full-attention decoder layers built by HF's text model; with
    `ptd` also the parallel-drafting mask inputs mtp.mask_embedding and mtp.mask_hidden.

    No mtp.* at all when mtp_layers == 0 (a checkpoint without a draft head)."""
    if mtp_layers == 0:
        return {}
    h = cfg.text_config.hidden_size
    out: dict[str, torch.Tensor] = {"mtp.fc.weight": torch.randn(h, 2 * h) * INIT_STD}
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{name}.weight"] = torch.randn(h) * NORM_STD
    stack = mtp_stack(cfg.text_config, mtp_layers)
    _perturb(stack)
    for name, tensor in stack.state_dict().items():
        if name.startswith("layers."):
            out[f"mtp.{name}"] = tensor.clone()
    if ptd:
        out["mtp.mask_embedding"] = torch.randn(h) * INIT_STD
        out["mtp.mask_hidden"] = torch.randn(h)
    return out


def build_tiny_checkpoint(
    arch: str,
    out_dir,
    mtp_layers: int = 1,
    seed: int = 0,
    tie_word_embeddings: bool = False,
    fused_experts: bool | None = None,
    ptd: bool = False,
    draft: bool = False,
    pard: bool = False,
) -> Path:
    """Write the tiny checkpoint into `out_dir` (created if needed) and return it as a Path.

    `draft`: the smaller sizes of a draft model for the tiny targets (DRAFT_SIZES; same tokenizer, so the same
    vocabulary). `pard`: the config declares a PARD mask token (`pard_token`: the last, padding id).

    `fused_experts` (MoE only): None writes the published Qwen3.5 layout (fused 3-D experts in the main model,
    per-expert in mtp.*); True/False force fused 3-D / per-expert tensors for both the main model and mtp.*.
    """
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if mtp_layers < 0:
        raise ValueError("mtp_layers must be >= 0")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(out)
    eos_id = tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[0])
    cfg = make_config(arch, padded_vocab_size(tokenizer), eos_id, mtp_layers, tie_word_embeddings,
                      DRAFT_SIZES if draft else None)  # fmt: skip
    if pard:
        cfg.text_config.pard_token = cfg.text_config.vocab_size - 1

    torch.manual_seed(seed)
    model = published_model_class(cfg)(cfg).float().eval()
    _perturb(model)
    with torch.no_grad():
        head = model.get_output_embeddings().weight  # the embedding itself when tied
        head *= HEAD_STD / INIT_STD  # wide logits for clear greedy margins
        head[len(tokenizer) :] *= 0.1  # ids past the tokenizer (vocab padding): small logits, never greedy picks
    if ptd and mtp_layers == 0:
        raise ValueError("ptd needs an MTP head (mtp_layers >= 1)")
    mtp = _mtp_tensors(cfg, mtp_layers, ptd)
    write_published_checkpoint(model, out, mtp, fused_experts, SHARD_BYTES)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=ARCHS, required=True)
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--mtp_layers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tie_word_embeddings", action="store_true")
    parser.add_argument("--draft", action="store_true",
                        help="the smaller sizes of a draft model (--mtp_mode draft_model)")
    parser.add_argument("--pard", action="store_true", help="declare a PARD mask token (pard_token) in the config")
    parser.add_argument("--ptd", action="store_true", help="also write the parallel-drafting mask inputs "
                        "(mtp.mask_embedding, mtp.mask_hidden)")
    layout = parser.add_mutually_exclusive_group()
    layout.add_argument("--fused_experts", dest="fused_experts", action="store_true", default=None,
                        help="MoE: fused 3-D experts in the main model and mtp.* (default: the published Qwen3.5 "
                        "layout, fused in the main model, per expert in mtp.*)")
    layout.add_argument("--per_expert", dest="fused_experts", action="store_false",
                        help="MoE: per-expert experts.{e}.{gate,up,down}_proj.weight in the main model and mtp.*")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    a = args
    out = build_tiny_checkpoint(a.arch, a.out, a.mtp_layers, a.seed, a.tie_word_embeddings, a.fused_experts, a.ptd,
                                a.draft, a.pard)  # fmt: skip
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"wrote {out} ({size / 1e6:.2f} MB) in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
