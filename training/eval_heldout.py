"""Held-out losses of a published-layout checkpoint: the main LM loss, each MTP module's loss and agreement (and the
parallel-drafting mask rows' when the checkpoint has them), by the training code's HF forward (trainable_mtp.py) over
windows of the tiny corpus's held-out files. The engine's own figure, real acceptance, is
lightllm_mtp/tools/eval_acceptance.py.

    python -m training.eval_heldout --model_dir lightllm_mtp/fixtures/tiny_qwen3_5_trained [--device cuda] \\
        [--windows 16] [--seq_len 512] [--out heldout.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

from lightllm_mtp.tools.tiny_corpus import split_corpus, token_stream
from training.trainable_mtp import load_tiny_mtp_model, stream_losses


def heldout_losses(model_dir: str | Path, windows: int, seq_len: int, device: str) -> dict:
    """Main / MTP losses and MTP agreement on the first `windows` held-out windows of `seq_len` tokens (fp32; bf16
    autocast on CUDA)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_tiny_mtp_model(model_dir).to(device)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.startswith("cuda") else nullcontext
    stream = token_stream(tokenizer, split_corpus().heldout, tokenizer.eos_token_id)
    losses = stream_losses(model, stream, seq_len, windows, 8, device, autocast)
    return {**losses, "windows": windows, "seq_len": seq_len}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_dir", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--windows", type=int, default=16, help="held-out windows (>= 1)")
    p.add_argument("--seq_len", type=int, default=512, help="tokens per window (>= 1)")
    p.add_argument("--out", default=None, help="JSON path (default: print only)")
    args = p.parse_args(argv)
    if args.windows < 1 or args.seq_len < 1:
        p.error("--windows and --seq_len must be >= 1")
    argv = list(sys.argv[1:] if argv is None else argv)
    result = {
        "model_dir": str(args.model_dir),
        "command": "python -m training.eval_heldout " + " ".join(argv),
        "python": sys.version.split()[0],
        "heldout": heldout_losses(args.model_dir, args.windows, args.seq_len, args.device),
    }
    print(f"held-out losses: {json.dumps(result['heldout'])}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
