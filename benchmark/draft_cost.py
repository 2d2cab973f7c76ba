"""Draft cost per speculative step, by drafting mode and k, at a published shape with random weights.

    python benchmark/draft_cost.py --model_shape qwen3.5-27b --device cuda --ks 1,2,3,4,5,6,7 \
        --modes eagle_with_att,vanilla_with_att,ptd --acceptance fixtures/.../acceptance_gpu.json

One plain-decoding engine, then one MTP engine per (mode, k) (eagle: k sequential passes of one module; vanilla:
multi-layer MTP, k modules, the random checkpoint declaring max(ks) MTP layers; ptd: one window forward;
draft_model: an external draft at --draft_shape (random weights), a window pass then k-1 chain steps; pard: that
draft, one window forward).

    python benchmark/draft_cost.py --model_shape qwen3.5-27b --draft_shape qwen3.5-0.8b --device cuda \
        --ks 1,2,3,4,5 --modes draft_model,pard,eagle_with_att --out benchmark/results/draft_model_cost_27b_h100.json
 For each:
median full-batch step, verify and draft time (CUDA events around the target and draft forwards), draft forwards
per step, and the step cost relative to a plain decode step. With --acceptance (eval_acceptance JSON files holding
`by_mode`), the speedup each mode would give at that measured tokens-per-step: tokens_per_step / step_cost.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmark.model_shapes import MODEL_SHAPES
from benchmark.model_source import build_engine, engine_settings, resolve_source
from benchmark.static_generation import generate
from benchmark.static_inference import KV_SLACK, free_device_memory
from benchmark.timing import ForwardTimer, MultiTimer, device_info, percentile, versions


def timed(engine, prompts, args, k: int, timers=None):
    generate(engine, prompts, min(args.output_len, 4 + k), timers, k)  # warm-up
    for t in timers or ():
        t.take()
    return generate(engine, prompts, args.output_len, timers, k)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_shape", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--input_len", type=int, default=1024)
    p.add_argument("--output_len", type=int, default=40)
    p.add_argument("--ks", default="1,2,3,4,5,6,7")
    p.add_argument("--modes", default="eagle_with_att,vanilla_with_att,ptd",
                   help="comma list of eagle_with_att, vanilla_with_att, ptd, draft_model, pard")
    p.add_argument("--draft_shape", default="qwen3.5-0.8b", help="the draft model's shape (draft_model, pard)")
    p.add_argument("--acceptance", nargs="*", default=[], help="eval_acceptance JSON files (by_mode)")
    p.add_argument("--draft_vocab_sizes", default="0", help="comma list; 0: the full vocabulary, N: a reduced draft "
                   "vocabulary of N ids (random weights: the first N ids, for timing only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    modes = args.modes.split(",")
    ns = engine_settings(args, args.batch_size, mtp_layers=max(ks))
    source = resolve_source(ns)
    device = torch.device(args.device)
    max_model_len = args.input_len + args.output_len + 3 * (max(ks) + 1) + KV_SLACK  # the MTP lookahead slots
    gen = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(0, source.cfg.vocab_size, (args.batch_size, args.input_len), generator=gen).tolist()

    engine = build_engine(source, ns, max_model_len, mtp=False)
    decode_ms = percentile(timed(engine, prompts, args, 0).step_ms, 50)
    del engine
    free_device_memory(device)
    print(f"decode step {decode_ms:.3f} ms", flush=True)

    vocab_sizes = [int(v) for v in args.draft_vocab_sizes.split(",")]
    vocab_files = {}
    for n in vocab_sizes:
        if n:
            vocab_files[n] = Path(tempfile.mkdtemp()) / f"draft_vocab_{n}.json"
            vocab_files[n].write_text(json.dumps({"token_ids": list(range(n)), "vocab_size": source.cfg.vocab_size}))
    rows: list[dict] = []
    report = {
        "command": "python " + " ".join(sys.argv if argv is None else ["benchmark/draft_cost.py", *argv]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": device_info(device),
        "versions": versions(),
        "model": {"shape": args.model_shape, "mtp_num_hidden_layers": max(ks), "weights": "random"},
        "settings": {"batch_size": args.batch_size, "input_len": args.input_len, "output_len": args.output_len,
                     "max_model_len": max_model_len},  # fmt: skip
        "method": "median of full-batch steps (time between engine.step() returns, overlap on); verify / draft: "
        "CUDA events around the target forward and every draft-module forward of a step; random weights, so "
        "drafts are rejected and every step verifies k drafts",
        "decode_step_ms": decode_ms,
        "results": rows,
        "speedup_at_measured_acceptance": [],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    draft_dir = None
    if {"draft_model", "pard"} & set(modes):  # the draft's config at its published shape; random weights
        draft_dir = Path(tempfile.mkdtemp(prefix="lightllm_mtp_draft_shape_"))
        (draft_dir / "config.json").write_text(json.dumps(MODEL_SHAPES[args.draft_shape]))
        report["model"]["draft_shape"] = args.draft_shape
    for mode, k, vocab in [(m, k, v) for m in modes for k in ks for v in vocab_sizes]:
        ns.mtp_draft_vocab_file, ns.mtp_draft_vocab_size = (str(vocab_files[vocab]), vocab) if vocab else (None, None)
        ns.mtp_mode = {"ptd": "eagle_with_att", "pard": "draft_model"}.get(mode, mode)
        ns.mtp_step, ns.parallel_drafting = k, mode in ("ptd", "pard")
        ns.mtp_draft_model_dir = str(draft_dir) if mode in ("draft_model", "pard") else None
        ns.mtp_mask_token_id = 0 if mode == "pard" else None  # random weights: any id
        engine = build_engine(source, ns, max_model_len, mtp=True)
        proposer = engine.runner.proposer
        drafts = [proposer.window, proposer.chain] if ns.mtp_draft_model_dir else proposer.modules
        timers = (ForwardTimer(engine.model_runner, device),
                  MultiTimer([ForwardTimer(d, device) for d in drafts]))  # fmt: skip
        rec = timed(engine, prompts, args, k, timers)
        del engine, timers
        free_device_memory(device)
        row = {
            "mode": mode,
            "k": k,
            "draft_vocab_size": vocab or source.cfg.vocab_size,
            "steps_timed": len(rec.step_ms),
            "step_ms": percentile(rec.step_ms, 50),
            "verify_ms": percentile(rec.verify_ms, 50),
            "draft_ms": percentile(rec.draft_ms, 50),
            "draft_forwards_per_step": percentile(rec.draft_calls, 50),
        }
        row["step_cost"] = row["step_ms"] / decode_ms
        rows.append(row)
        print(json.dumps(row), flush=True)
        out.write_text(json.dumps(report, indent=1) + "\n")  # partial results survive a time limit
    for r in rows:
        base = next((b for b in rows if (b["mode"], b["draft_vocab_size"], b["k"]) == (r["mode"], r["draft_vocab_size"], 1)),
                    None)  # fmt: skip
        if base:
            r["draft_ms_vs_k1"] = r["draft_ms"] / base["draft_ms"]
    speedups = []
    for path in args.acceptance:
        if not Path(path).is_file():  # e.g. an unmatched shell glob: the fixture is not trained yet
            print(f"no acceptance file {path}: skipped", flush=True)
            continue
        measured = json.loads(Path(path).read_text())
        for mode, by_k in measured.get("by_mode", {}).items():
            for k, stats in by_k.items():
                full = source.cfg.vocab_size
                row = next((r for r in rows if (r["mode"], r["k"], r["draft_vocab_size"]) == (mode, int(k), full)), None)
                if row:
                    speedups.append({"acceptance_from": path, "mode": mode, "k": int(k),
                                     "tokens_per_step": stats["tokens_per_step"],
                                     "acceptance_per_position": stats["acceptance_per_position"],
                                     "step_cost": row["step_cost"],
                                     "speedup": stats["tokens_per_step"] / row["step_cost"]})  # fmt: skip
    report["speedup_at_measured_acceptance"] = speedups
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
