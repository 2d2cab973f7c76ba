"""Real MTP acceptance of a checkpoint on held-out standard-library text, measured with this engine.

    python -m lightllm_mtp.tools.eval_acceptance --model_dir lightllm_mtp/fixtures/tiny_qwen3_5_trained --strict

Greedy generation from held-out prompts (tiny_corpus.heldout_prompts) without speculation, then for each drafting
mode of --mtp_modes (eagle_with_att, vanilla_with_att = multi-layer MTP, ptd = eagle_with_att with parallel
drafting, draft_model = the external draft of --draft_model_dir, pard = that draft with parallel drafting) and each
mtp_step k. Per k: tokens per verify step (accepted drafts + 1, the "accept
length"), accepted drafts per step, and acceptance at draft position j (accepted / proposed; a draft counts as
accepted only when every draft before it was), all weighted by verify steps over the requests. Each MTP run's
tokens are compared with plain decoding (--strict: a mismatch is an error). Writes JSON. The checkpoint's held-out
losses (the training code's HF forward of the same weights) are `python -m training.eval_heldout`, outside the
runtime package.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from lightllm_mtp.engine.llm import RequestOutput
from lightllm_mtp.spec_decode.stats import SpecStats


def aggregate(outputs: list[RequestOutput]) -> dict:
    """Acceptance over requests: their counts summed (so each verify step weighs the same)."""
    total = sum((o.spec for o in outputs), SpecStats())
    if total.verify_steps == 0:
        raise ValueError("no verify step ran: MTP was not active")
    return {
        "verify_steps": total.verify_steps,
        "tokens_per_step": round(total.tokens_per_step, 4),
        "accepted_per_step": round(total.accepted_drafts_per_step, 4),
        "acceptance_per_position": [round(a, 4) for a in total.acceptance_per_position],
    }


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def evaluate(args) -> dict:
    from transformers import AutoTokenizer

    from lightllm_mtp import LLM, SamplingParams
    from lightllm_mtp.tools.tiny_corpus import heldout_prompts, split_corpus

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    prompts = heldout_prompts(tokenizer, split_corpus().heldout, args.num_prompts, args.prompt_tokens)
    ids = [p for _, p in prompts]
    params = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens, ignore_eos=True)
    engine_kwargs = dict(device=args.device, dtype=args.dtype, max_batch_size=args.max_batch_size,
                         max_model_len=args.prompt_tokens + args.max_new_tokens + 8)  # fmt: skip

    def run(**mtp):
        llm = LLM(args.model_dir, **engine_kwargs, **mtp)
        start = time.perf_counter()
        outs = llm.generate(ids, params)
        return outs, time.perf_counter() - start

    plain, plain_s = run()
    result = {
        "model_dir": str(args.model_dir),
        "draft_model_dir": getattr(args, "draft_model_dir", None),
        "command": "python -m lightllm_mtp.tools.eval_acceptance " + " ".join(args.argv),
        "device": args.device,
        "dtype": args.dtype,
        "python": sys.version.split()[0],
        "prompts": {"count": len(ids), "prompt_tokens": args.prompt_tokens, "max_new_tokens": args.max_new_tokens,
                    "files": [path for path, _ in prompts]},
        "plain": {"seconds": round(plain_s, 2)},
        "samples": [{"prompt": tokenizer.decode(p), "continuation": o.text} for p, o in zip(ids[:3], plain[:3])],
    }  # fmt: skip
    result["by_mode"] = {}
    from lightllm_mtp.config.model_config import ModelConfig

    modules = ModelConfig.from_model_dir(args.model_dir).mtp_num_hidden_layers
    for mode in args.mtp_modes:
        spec = dict(mtp_mode="eagle_with_att", parallel_drafting=True) if mode == "ptd" else dict(mtp_mode=mode)
        if mode in ("draft_model", "pard"):
            if args.draft_model_dir is None:
                raise SystemExit(f"--mtp_modes {mode} needs --draft_model_dir")
            spec = dict(mtp_mode="draft_model", mtp_draft_model_dir=args.draft_model_dir,
                        parallel_drafting=mode == "pard")
        by_k = result["by_mode"][mode] = {}
        for k in args.mtp_steps:
            if mode == "vanilla_with_att" and k > modules:  # one module per draft
                continue
            outs, seconds = run(**spec, mtp_step=k)
            mismatches = {i: first_divergence(o.token_ids, r.token_ids) for i, (o, r) in enumerate(zip(outs, plain))}
            mismatches = {i: pos for i, pos in mismatches.items() if pos is not None}
            by_k[str(k)] = {**aggregate(outs), "seconds": round(seconds, 2), "greedy_equal": not mismatches,
                            "first_divergence": mismatches}  # fmt: skip
            print(f"{mode} k={k}: {json.dumps(by_k[str(k)])}")
            if mismatches and args.strict:
                raise SystemExit(f"{mode} k={k}: MTP greedy output differs from plain decoding (request: position) "
                                 f"{mismatches}")  # fmt: skip
    result["mtp"] = result["by_mode"][args.mtp_modes[0]]
    return result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_dir", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", help="auto: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--mtp_steps", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--mtp_modes", nargs="+", default=["eagle_with_att"],
                   choices=["eagle_with_att", "vanilla_with_att", "ptd", "draft_model", "pard"],
                   help="drafting modes (vanilla_with_att: multi-layer MTP, k <= the checkpoint's MTP layers; ptd: "
                   "parallel drafting, needs the mask inputs; draft_model / pard: the --draft_model_dir checkpoint "
                   "autoregressively / PARD); 'mtp' in the JSON is the first")
    p.add_argument("--draft_model_dir", default=None, help="the draft checkpoint of --mtp_modes draft_model / pard")
    p.add_argument("--num_prompts", type=int, default=16)
    p.add_argument("--prompt_tokens", type=int, default=128)
    p.add_argument("--max_new_tokens", type=int, default=64)
    p.add_argument("--max_batch_size", type=int, default=16)
    p.add_argument("--strict", action="store_true", help="fail when MTP greedy output differs from plain decoding")
    p.add_argument("--out", default=None, help="JSON path (default: print only)")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.device == "cpu":
        torch.set_num_threads(min(4, torch.get_num_threads()))
    result = evaluate(args)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
