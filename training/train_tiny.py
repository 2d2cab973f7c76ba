"""Train a tiny Qwen3.5 (dense or MoE) and its MTP head on the Python standard library; write the published layout.

    python -m training.train_tiny --arch qwen3_5 --out /tmp/tiny_qwen3_5_trained

Loss = main LM loss + mtp_loss_weight * MTP loss (the head at position t reads (h_t, x_{t+1}) and predicts x_{t+2})
+ router_aux_loss_coef * load-balancing loss (MoE). `--mtp_layers N` trains N modules, module m at position t
reading module m-1's hidden and x_{t+m+1} and predicting x_{t+m+2} (each its own MTP loss term, same weight);
`--ptd` also trains the parallel-drafting mask inputs: mask rows after `ptd_anchors` random positions per batch,
mask row j predicting the token j+1 after the anchor's (ptd_loss_weight).
The BPE tokenizer is trained on the training files first; the held-out files (tiny_corpus.is_heldout) give the held-out losses. Prints the loss curve, writes the checkpoint
(config.json with text_config, model.language_model.*, lm_head, mtp.*, tokenizer) and train_log.json.
A separate draft model (or PARD draft) for a trained target: training/train_draft.py.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from lightllm_mtp.config.spec_config import MAX_MTP_STEP
from lightllm_mtp.tools.tiny_recipe import ARCHS, SPECIAL_TOKENS, make_config, train_tokenizer
from lightllm_mtp.tools.published_layout import padded_vocab_size, write_published_checkpoint
from lightllm_mtp.tools.tiny_corpus import split_corpus, stdlib_root, token_stream
from training.trainable_mtp import TinyMtpModel, stream_losses, use_torch_gated_delta_rule

SHARD_BYTES = 5 * 1024 * 1024


def text_sizes(arch: str, hidden: int, layers: int, intermediate: int | None) -> dict:
    """Text-config sizes scaled from the hidden size: GQA 4 query / 2 KV heads, GDN 2 key / 4 value heads."""
    head_dim = max(32, hidden // 4)
    sizes = dict(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=head_dim, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=hidden // 4,
        linear_value_head_dim=hidden // 4, initializer_range=0.02,
    )  # fmt: skip
    if arch == "qwen3_5_moe":  # 8 experts, top-2, plus the shared expert
        sizes.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=intermediate or hidden // 4)
        sizes.update(shared_expert_intermediate_size=2 * (intermediate or hidden // 4))
    else:
        sizes.update(intermediate_size=intermediate or 2 * hidden)
    return sizes


class RouterLogits:
    """Collects every MoE router's logits during a forward (forward hooks on the blocks' `gate` modules)."""

    def __init__(self, model: torch.nn.Module):
        self.logits: list[torch.Tensor] = []
        self.top_k = 0
        for module in model.modules():
            if hasattr(module, "gate") and hasattr(module, "shared_expert"):
                module.gate.register_forward_hook(self._hook)
                self.top_k = model.cfg.text_config.num_experts_per_tok

    def _hook(self, module, args, output):
        self.logits.append(output[0] if isinstance(output, tuple) else output)

    def pop_balance_loss(self) -> torch.Tensor | None:
        """Switch-style E * sum_e(fraction of routed slots_e * mean probability_e), averaged over the routers."""
        if not self.logits:
            return None
        losses = []
        for logits in self.logits:
            probs = logits.float().softmax(-1)
            chosen = F.one_hot(probs.topk(self.top_k, dim=-1).indices, probs.shape[-1]).sum(1).float()
            losses.append(probs.shape[-1] * (chosen.mean(0) / self.top_k * probs.mean(0)).sum())
        self.logits.clear()
        return torch.stack(losses).mean()


def sample_windows(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - length, (batch,), generator=gen)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])


def learning_rate(step: int, args) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    warmup = max(1, min(args.warmup_steps, args.steps // 10))
    if step < warmup:
        return args.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, args.steps - warmup)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only (not on norms, GDN decay parameters or biases)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


def train(args) -> tuple[TinyMtpModel, dict]:
    """Tokenizer, model, training loop, held-out evaluation and checkpoint; returns the model (fp32) and the log."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    corpus = split_corpus(args.corpus_chars, args.corpus_chars and max(args.corpus_chars // 10, 20_000))
    tokenizer = train_tokenizer(out, [f.text for f in corpus.train], args.vocab_size - len(SPECIAL_TOKENS))
    eos_id = tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[0])
    train_ids = token_stream(tokenizer, corpus.train, eos_id)
    heldout_ids = token_stream(tokenizer, corpus.heldout, eos_id)
    print(f"corpus: Python {platform.python_version()} standard library at {stdlib_root()}")
    print(f"corpus: {len(corpus.train)} train files ({len(train_ids)} tokens), {len(corpus.heldout)} held-out "
          f"files ({len(heldout_ids)} tokens), tokenizer {len(tokenizer)} tokens, {time.perf_counter() - start:.1f} s")

    if args.gdn_kernel == "torch":
        use_torch_gated_delta_rule()
    sizes = text_sizes(args.arch, args.hidden_size, args.num_hidden_layers, args.intermediate_size)
    cfg = make_config(args.arch, padded_vocab_size(tokenizer), eos_id, args.mtp_layers, False, sizes)
    masks = MAX_MTP_STEP - 1 if args.ptd else 0
    model = TinyMtpModel(cfg, args.ptd, num_masks=masks, anchors=args.ptd_anchors if args.ptd else 0)
    model = model.to(args.device).train()
    window = args.seq_len + model.window_extra
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"model: {args.arch}, {n_params / 1e6:.2f} M trainable parameters (main + MTP head), device {args.device}")
    routers = RouterLogits(model)
    optimizer = torch.optim.AdamW(parameter_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95))
    cuda = str(args.device).startswith("cuda")
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else nullcontext
    gen = torch.Generator().manual_seed(args.seed)

    def heldout(model):
        windows, batch = args.eval_windows, args.batch_size
        losses = stream_losses(model, heldout_ids, args.seq_len, windows, batch, args.device, autocast)
        model.train()
        return losses

    fixed = sample_windows(train_ids, args.batch_size, window, gen) if args.overfit_batch else None

    curve, evals, tokens_seen = [], [], 0
    t0 = time.perf_counter()
    bar = tqdm(range(args.steps), desc=f"train {args.arch}", disable=args.no_progress_bar)
    for step in bar:
        batch = fixed if fixed is not None else sample_windows(train_ids, args.batch_size, window, gen)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        with autocast():
            losses = model(batch.to(args.device, non_blocking=True), gen)
            mtp = sum(v for k, v in losses.items() if k.startswith("mtp_loss"))
            loss = losses["main_loss"] + args.mtp_loss_weight * mtp
            if "ptd_loss" in losses:
                loss = loss + args.ptd_loss_weight * losses["ptd_loss"]
            balance = routers.pop_balance_loss()
            if balance is not None:
                loss = loss + args.router_aux_loss_coef * balance
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        tokens_seen += batch.shape[0] * args.seq_len
        if step % args.log_every == 0 or step == args.steps - 1:
            elapsed = time.perf_counter() - t0
            point = {"step": step, "lr": round(learning_rate(step, args), 6)}
            point["tokens_per_s"] = round(tokens_seen / elapsed)
            point.update({k: round(v.item(), 4) for k, v in losses.items() if v.ndim == 0})
            if balance is not None:
                point["balance_loss"] = round(balance.item(), 4)
            curve.append(point)
            bar.set_postfix(main=point["main_loss"], mtp=point["mtp_loss"], agree=point["mtp_agree"])
            tqdm.write(json.dumps(point))
        if args.eval_every and step and step % args.eval_every == 0:
            evals.append({"step": step, **heldout(model)})
            tqdm.write("held-out " + json.dumps(evals[-1]))
            routers.logits.clear()
    train_seconds = time.perf_counter() - t0
    final = heldout(model)
    routers.logits.clear()
    print(f"held-out after {args.steps} steps ({train_seconds:.0f} s): {json.dumps(final)}")

    model = model.float().cpu().eval()
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype_save]
    published = model.published_model()
    write_published_checkpoint(published, out, model.mtp.checkpoint_tensors(), False, SHARD_BYTES, dtype)
    log = {
        "command": "python -m training.train_tiny " + shlex.join(args.argv),
        "args": {k: v for k, v in vars(args).items() if k != "argv"},
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "device_name": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "corpus": {"train_files": len(corpus.train), "heldout_files": [f.path for f in corpus.heldout],
                   "train_tokens": len(train_ids), "heldout_tokens": len(heldout_ids)},
        "parameters": n_params,
        "train_seconds": round(train_seconds, 1),
        "curve": curve,
        "heldout_evals": evals,
        "heldout_final": final,
        "text_config": cfg.text_config.to_dict(),
    }  # fmt: skip
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"wrote {out} ({size / 1e6:.1f} MB of weights) in {time.perf_counter() - start:.0f} s")
    return model, log


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=ARCHS, required=True)
    p.add_argument("--out", required=True, help="output checkpoint directory")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--seq_len", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup_steps", type=int, default=200)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--mtp_loss_weight", type=float, default=0.5)
    p.add_argument("--mtp_layers", type=int, default=1, help="MTP modules (mtp.layers.0..N-1), module m drafting "
                   "the token m+2 after its position (multi-layer MTP, mtp_mode vanilla_with_att)")
    p.add_argument("--ptd", action="store_true", help="also train parallel drafting's mask inputs "
                   "(mtp.mask_embedding, mtp.mask_hidden) for up to 7 drafts per forward")
    p.add_argument("--ptd_anchors", type=int, default=4, help="anchor positions per batch whose mask rows are trained")
    p.add_argument("--ptd_loss_weight", type=float, default=0.5)
    p.add_argument("--router_aux_loss_coef", type=float, default=0.01, help="MoE load-balancing loss weight")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype_save", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--hidden_size", type=int, default=256)
    p.add_argument("--num_hidden_layers", type=int, default=8, help="every 4th layer is full attention, others GDN")
    p.add_argument("--intermediate_size", type=int, default=None, help="default: 2*hidden (dense), hidden/4 (experts)")
    p.add_argument("--vocab_size", type=int, default=4096, help="tokenizer size, special tokens included")
    p.add_argument("--corpus_chars", type=int, default=None, help="cap on training characters (tests); default all")
    p.add_argument("--eval_windows", type=int, default=128, help="held-out windows of seq_len per evaluation")
    p.add_argument("--eval_every", type=int, default=250)
    p.add_argument("--log_every", type=int, default=50)
    p.add_argument("--gdn_kernel", choices=("torch", "auto"), default="torch",
                   help="torch: transformers' PyTorch gated delta rule (exact backward everywhere); auto: whatever "
                   "transformers picks (fla-core when importable; its backward needs Triton >= 3.7.1 on Hopper)")
    p.add_argument("--overfit_batch", action="store_true", help="debug: train on one fixed batch")
    p.add_argument("--no_progress_bar", action="store_true")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv: list[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
