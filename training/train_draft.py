"""Train a small draft model for a trained tiny target (`--mtp_mode draft_model`): same tokenizer (copied from the
target, so the same vocabulary), fewer layers / smaller hidden, tied embeddings, plain LM loss; with `--pard` also
PARD's mask-token loss, so that one forward from [x_{t+1}, MASK x (k-1)] drafts k tokens.

    python -m training.train_draft --target_dir lightllm_mtp/fixtures/tiny_qwen3_5_trained \\
        --out fixtures/tiny_qwen3_5_draft_trained [--pard]

PARD training (a GDN draft is recurrent, so mask rows cannot be attention-masked side branches as in the MTP
head's PTD training): every window gets one anchor a (uniform in the second half); positions a+1..a+K-1 read the
mask token and mask row j predicts x_{a+1+j}, the rows up to a keep the LM loss and rows past the mask rows are
ignored. The mask token is `--mask_token` (default <|im_start|>: the tiny vocabulary has no free id, and the
standard-library corpus never contains it), written to config.json as `pard_token`.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lightllm_mtp.config.spec_config import MAX_MTP_STEP
from lightllm_mtp.tools.published_layout import published_model_class, write_published_checkpoint
from lightllm_mtp.tools.tiny_corpus import split_corpus, token_stream
from lightllm_mtp.tools.tiny_recipe import make_config
from training.train_tiny import learning_rate, parameter_groups, sample_windows, text_sizes
from training.trainable_mtp import use_torch_gated_delta_rule

SHARD_BYTES = 5 * 1024 * 1024
IGNORE = -100


def draft_lm(cfg) -> torch.nn.Module:
    import transformers

    text = cfg.text_config
    lm = getattr(transformers, type(text).__name__.replace("TextConfig", "ForCausalLM"))(text)
    embed = lm.model.embed_tokens
    if embed.padding_idx is not None:  # pad = eos separates documents: it needs a trained embedding
        with torch.no_grad():
            embed.weight[embed.padding_idx].normal_(0.0, text.initializer_range)
        embed.padding_idx = None
    return lm


def pard_batch(tokens: torch.Tensor, mask_token: int, num_masks: int, gen: torch.Generator):
    """tokens [B, L+1] -> (inputs [B, L], labels [B, L], mask-row label positions [B, L] bool): one anchor a per
    row, inputs a+1..a+num_masks read the mask token, labels past the mask rows ignored."""
    bsz, length = tokens.shape[0], tokens.shape[1] - 1
    inputs, labels = tokens[:, :length].clone(), tokens[:, 1:].clone()
    anchors = torch.randint(length // 2, length - num_masks, (bsz,), generator=gen)
    pos = torch.arange(length)[None, :]
    is_mask = (pos > anchors[:, None]) & (pos <= anchors[:, None] + num_masks)
    inputs[is_mask] = mask_token
    labels[pos > anchors[:, None] + num_masks] = IGNORE
    return inputs, labels, is_mask


def train(args) -> dict:
    from transformers import AutoTokenizer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.target_dir)
    tokenizer.save_pretrained(out)
    target = json.loads((Path(args.target_dir) / "config.json").read_text())
    text_target = target.get("text_config", target)
    vocab, eos_id = text_target["vocab_size"], tokenizer.eos_token_id
    arch = "qwen3_5_moe" if "num_experts" in text_target else "qwen3_5"
    corpus = split_corpus(args.corpus_chars, args.corpus_chars and max(args.corpus_chars // 10, 20_000))
    train_ids = token_stream(tokenizer, corpus.train, eos_id)
    heldout_ids = token_stream(tokenizer, corpus.heldout, eos_id)
    use_torch_gated_delta_rule()
    sizes = text_sizes(arch if args.moe else "qwen3_5", args.hidden_size, args.num_hidden_layers, None)
    cfg = make_config("qwen3_5_moe" if args.moe else "qwen3_5", vocab, eos_id, 0, True, sizes)
    mask_token = None
    if args.pard:
        mask_token = tokenizer.convert_tokens_to_ids(args.mask_token)
        cfg.text_config.pard_token = mask_token
    lm = draft_lm(cfg).to(args.device).train()
    n_params = sum(p.numel() for p in lm.parameters())
    print(f"draft: {n_params / 1e6:.2f} M parameters, {len(train_ids)} train tokens, target {args.target_dir}")
    optimizer = torch.optim.AdamW(parameter_groups(lm, args.weight_decay), lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    num_masks = MAX_MTP_STEP - 1
    curve, t0 = [], time.perf_counter()
    for step in range(args.steps):
        tokens = sample_windows(train_ids, args.batch_size, args.seq_len + 1, gen)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        if mask_token is None:
            inputs, labels, is_mask = tokens[:, :-1], tokens[:, 1:], torch.zeros(1, dtype=torch.bool)
        else:
            inputs, labels, is_mask = pard_batch(tokens, mask_token, num_masks, gen)
        logits = lm(input_ids=inputs.to(args.device)).logits.float()
        labels, is_mask = labels.to(args.device), is_mask.to(args.device)
        lm_labels = torch.where(is_mask, IGNORE, labels) if mask_token is not None else labels
        loss = lm_loss = F.cross_entropy(logits.reshape(-1, vocab), lm_labels.reshape(-1), ignore_index=IGNORE)
        point = {"step": step, "lm_loss": round(lm_loss.item(), 4)}
        if mask_token is not None:
            pard_loss = F.cross_entropy(logits[is_mask], labels[is_mask])
            loss = loss + args.pard_loss_weight * pard_loss
            point["pard_loss"] = round(pard_loss.item(), 4)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        optimizer.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            point["seconds"] = round(time.perf_counter() - t0, 1)
            curve.append(point)
            print(json.dumps(point), flush=True)
    train_seconds = time.perf_counter() - t0
    lm = lm.float().cpu().eval()
    with torch.no_grad():
        windows = sample_windows(heldout_ids, 16, args.seq_len + 1, torch.Generator().manual_seed(1))
        heldout = F.cross_entropy(lm(input_ids=windows[:, :-1]).logits.reshape(-1, vocab), windows[:, 1:].reshape(-1))
    model = published_model_class(cfg)(cfg)
    model.model.language_model.load_state_dict(lm.model.state_dict())
    model.lm_head.load_state_dict(lm.lm_head.state_dict())
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype_save]
    write_published_checkpoint(model, out, {}, False, SHARD_BYTES, dtype)
    log = {
        "command": "python -m training.train_draft " + shlex.join(args.argv),
        "args": {k: v for k, v in vars(args).items() if k != "argv"},
        "python": platform.python_version(), "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name() if str(args.device).startswith("cuda") else "cpu",
        "parameters": n_params, "train_seconds": round(train_seconds, 1), "curve": curve,
        "heldout_lm_loss": round(heldout.item(), 4), "pard_token": mask_token,
    }  # fmt: skip
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"held-out LM loss {heldout.item():.4f}; wrote {out} in {time.perf_counter() - start:.0f} s")
    return log


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target_dir", required=True, help="the trained target (its tokenizer and vocabulary)")
    p.add_argument("--out", required=True)
    p.add_argument("--pard", action="store_true", help="also train PARD's mask rows (parallel drafting)")
    p.add_argument("--mask_token", default="<|im_start|>", help="PARD's mask token (text of a vocabulary entry)")
    p.add_argument("--pard_loss_weight", type=float, default=1.0)
    p.add_argument("--moe", action="store_true", help="an MoE draft (default dense)")
    p.add_argument("--hidden_size", type=int, default=128)
    p.add_argument("--num_hidden_layers", type=int, default=4, help="every 4th layer full attention, others GDN")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--seq_len", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup_steps", type=int, default=60)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--corpus_chars", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype_save", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--log_every", type=int, default=25)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv: list[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
