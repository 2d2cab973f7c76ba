"""Kernel-time breakdown of one decode (or MTP) step at a named shape: where the time over the HBM floor goes; with
--prefill, of one whole prompt prefill (all its chunks) instead: where the time beside the GEMMs goes.

    python benchmark/profile_step.py --model_shape qwen3.5-27b --batch_size 1 --input_len 1024 --steps 8 \
        [--mtp_mode eagle_with_att --mtp_step 1] [--out benchmark/results/profile_27b_bs1.json]
    python benchmark/profile_step.py --model_shape qwen3.5-27b --prefill --input_len 16384 \
        --out benchmark/results/profile_prefill16k_27b.json

The engine runs eagerly (no CUDA graphs, so each kernel is visible to torch.profiler; kernel times equal the
graph's, launch gaps do not). Prints the kernels by total device time per step and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmark` and `lightllm_mtp` importable from the repo
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.profiler import ProfilerActivity, profile

from benchmark.model_shapes import MODEL_SHAPES
from benchmark.model_source import build_engine, resolve_source
from benchmark.timing import versions
from lightllm_mtp.sampling_params import SamplingParams


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_shape", choices=sorted(MODEL_SHAPES), default="qwen3.5-27b")
    p.add_argument("--model_dir", default=None)
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--input_len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=8, help="profiled steps (after 4 warm-up steps)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--mtp_mode", default=None)
    p.add_argument("--mtp_step", type=int, default=1)
    p.add_argument("--prefill", action="store_true",
                   help="profile one prefill of batch_size prompts of input_len (after a warm-up prefill) instead of "
                        "decode steps; kernels are also summed by category (GEMM, attention, GDN chunk, ...)")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    # the fields build_engine reads
    args.batch_sizes, args.seed, args.chunked_prefill_size, args.graph_max_batch_size = [args.batch_size], 0, None, 0
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    command = "python " + " ".join(sys.argv if argv is None else ["benchmark/profile_step.py", *argv])
    source = resolve_source(args)
    if args.prefill:
        prof, wall_ms, per = _profile_prefill(args, source)
    else:
        prof, wall_ms, per = _profile_steps(args, source)
    rows = []
    for e in prof.key_averages():
        dev_us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        if dev_us > 0:
            rows.append({"kernel": e.key, "us_per_step": dev_us / per, "calls_per_step": e.count / per})
    rows.sort(key=lambda r: -r["us_per_step"])
    kernel_ms = sum(r["us_per_step"] for r in rows) / 1e3
    report = {
        "command": command,
        "device": torch.cuda.get_device_name(),
        "versions": versions(),
        "shape": source.name,
        "batch_size": args.batch_size,
        "input_len": args.input_len,
        "mtp": {"mode": args.mtp_mode, "step": args.mtp_step} if args.mtp_mode else None,
        "what": "one prefill of batch_size x input_len prompt tokens" if args.prefill else "one decode / MTP step",
        "eager_step_wall_ms": wall_ms,
        "kernel_ms_per_step": kernel_ms,
        "gap_ms_per_step": wall_ms - kernel_ms,  # device idle (one stream): launch gaps and host syncs
        "categories_ms": categories(rows),
        "kernels": rows,
    }
    what = "prefill" if args.prefill else "eager step"
    print(f"{source.name} bs={args.batch_size} {what} {wall_ms:.2f} ms, kernels {kernel_ms:.2f} ms, gaps "
          f"{wall_ms - kernel_ms:.2f} ms; " + ", ".join(f"{k} {v:.1f}" for k, v in report["categories_ms"].items()))
    print(f"{'us/step':>9} {'calls':>6} {'%':>5}  kernel")
    for r in rows[: args.top]:
        pct = r["us_per_step"] / 1e3 / kernel_ms * 100
        print(f"{r['us_per_step']:9.1f} {r['calls_per_step']:6.1f} {pct:5.1f}  {r['kernel'][:110]}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


def _profile_steps(args, source):
    warmup, total = 4, 4 + args.steps
    max_len = args.input_len + (total + 2) * (args.mtp_step + 1) + 16
    engine = build_engine(source, args, max_len, mtp=bool(args.mtp_mode))
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, source.cfg.vocab_size, (args.batch_size, args.input_len), generator=gen).tolist()
    params = SamplingParams(temperature=0.0, max_new_tokens=(total + 2) * (args.mtp_step + 1), ignore_eos=True)
    for p in prompts:
        engine.add_request(p, params)
    while engine.scheduler.waiting or any(r.in_prefill for r in engine.scheduler.running):
        engine.step()
    for _ in range(warmup):
        engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3 / args.steps
    return prof, wall_ms, args.steps


def _profile_prefill(args, source):
    """A warm-up prefill (compiles and autotunes every kernel at these chunk shapes), then the profiled one: new
    prompts of the same length, one output token each (its prefill ends with the first sampled token)."""
    engine = build_engine(source, args, args.input_len + 8, mtp=bool(args.mtp_mode))
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True)

    def prefill():
        for p in torch.randint(0, source.cfg.vocab_size, (args.batch_size, args.input_len), generator=gen).tolist():
            engine.add_request(p, params)
        while engine.has_unfinished():
            engine.step()
        torch.cuda.synchronize()

    prefill()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        prefill()
        wall_ms = (time.perf_counter() - start) * 1e3
    return prof, wall_ms, 1


CATEGORIES = (  # (category, lower-case kernel-name fragments), first match wins
    ("GEMM", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul")),
    ("attention", ("_flash_prefill", "splitk", "_attn", "decode_att")),
    ("GDN chunk (fla)", ("chunk_", "solve_tril", "recompute_w_u", "l2norm", "merge_16x16", "prepare_")),
    ("GDN conv / gates", ("_conv1d", "gdn_gating", "_gdr_")),
    ("norms", ("rmsnorm",)),
    ("activation / gate / rope", ("silu", "sigmoid_gate", "rope", "qk_norm")),
)


def categories(rows: list[dict]) -> dict[str, float]:
    """ms per step by kernel category; 'other' holds the rest (copies, indexing, elementwise torch ops)."""
    out = {name: 0.0 for name, _ in CATEGORIES} | {"other": 0.0}
    for r in rows:
        key = r["kernel"].lower()
        name = next((n for n, frags in CATEGORIES if any(f in key for f in frags)), "other")
        out[name] += r["us_per_step"] / 1e3
    return out


if __name__ == "__main__":
    main()
