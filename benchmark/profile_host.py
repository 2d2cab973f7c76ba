"""Host-side profile of steady decode steps (CUDA graphs on, overlap on): where a step's wall time goes on the CPU.

    python benchmark/profile_host.py --model_dir lightllm_mtp/fixtures/tiny_qwen3_5_trained --batch_size 32 \
        [--mtp_mode eagle_with_att --mtp_step 1] [--out benchmark/results/profile_host_tiny_bs32.json]

For a model whose device work per step is small (the tiny checkpoints), the step is bound by the host: this runs
`steps` engine steps of a batch that only decodes (prompts prefilled before) under cProfile and prints the functions
by their own time per step, and the median step wall time without the profiler.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmark.model_source import build_engine, engine_settings, resolve_source
from benchmark.timing import device_info, versions
from lightllm_mtp.sampling_params import SamplingParams


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_dir", default=None)
    p.add_argument("--model_shape", default=None)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--input_len", type=int, default=128)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--mtp_mode", default=None)
    p.add_argument("--mtp_step", type=int, default=1)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    ns = engine_settings(args, args.batch_size, mtp_mode=args.mtp_mode, mtp_step=args.mtp_step)
    source = resolve_source(ns)
    max_len = args.input_len + 4 * args.steps * (args.mtp_step + 1) + 64
    engine = build_engine(source, ns, max_len, mtp=args.mtp_mode is not None)
    gen = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(0, source.cfg.vocab_size, (args.batch_size, args.input_len), generator=gen).tolist()
    params = SamplingParams(temperature=0.0, max_new_tokens=3 * args.steps * (args.mtp_step + 1), ignore_eos=True)
    reqs = [engine.add_request(ids, params) for ids in prompts]
    while any(r.in_prefill for r in reqs) or not all(r.output_ids for r in reqs):
        engine.step()
    for _ in range(8):  # warm-up of the decode path
        engine.step()
    wall = []
    for _ in range(args.steps):
        t = time.perf_counter()
        engine.step()
        wall.append(1e3 * (time.perf_counter() - t))
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.steps):
        engine.step()
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, name), (_cc, calls, own, cum, _callers) in stats.stats.items():
        rows.append({"function": f"{Path(file).name}:{line}:{name}", "calls_per_step": calls / args.steps,
                     "own_ms_per_step": 1e3 * own / args.steps, "cum_ms_per_step": 1e3 * cum / args.steps})  # fmt: skip
    rows.sort(key=lambda r: -r["own_ms_per_step"])
    wall.sort()
    report = {
        "command": "python " + " ".join(sys.argv if argv is None else ["benchmark/profile_host.py", *argv]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": device_info(torch.device(args.device)),
        "versions": versions(),
        "settings": vars(args),
        "step_wall_ms_median": wall[len(wall) // 2],
        "profiled_step_ms": sum(r["own_ms_per_step"] for r in rows),
        "by_own_time": rows[: args.top],
        "by_cumulative_time": sorted(rows, key=lambda r: -r["cum_ms_per_step"])[: args.top],
    }
    print(f"step wall ms (median, no profiler): {report['step_wall_ms_median']:.3f}")
    for r in report["by_own_time"]:
        print(f"{r['own_ms_per_step']:8.3f} ms own {r['cum_ms_per_step']:8.3f} ms cum {r['calls_per_step']:7.1f}x "
              f"{r['function']}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
