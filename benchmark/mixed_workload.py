"""Mixed workload: requests arrive while others decode, so prompt chunks and decode / verify rows share steps.

    python benchmark/mixed_workload.py --model_shape qwen3.5-27b --device cuda --concurrency 32 --num_requests 96 \
        --input_len 1024 --output_len 64 --mtp_mode eagle_with_att --mtp_step 1 [--engine_root DIR] --out FILE.json

Closed loop: `concurrency` requests run at once; whenever one finishes the next of `num_requests` is added, so after
the first wave every step carries the new arrivals' prompt chunks beside the running requests' decode (or MTP
verify) rows. Random prompt ids, greedy, ignore_eos. One warm-up round of `concurrency` requests, then the timed
run: steps/s, output tok/s and the step-time distribution (perf_counter between consecutive `step_outputs`
returns, no synchronize in between, so overlap scheduling counts). `--engine_root` runs another checkout of the
engine (e.g. an older commit exported with `git archive`) through the same script, for before/after figures.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model_shape")
    src.add_argument("--model_dir")
    p.add_argument("--device", default="cuda")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--num_requests", type=int, default=96)
    p.add_argument("--input_len", type=int, default=1024)
    p.add_argument("--output_len", type=int, default=64)
    p.add_argument("--chunked_prefill_size", type=int, default=2048)
    p.add_argument("--mtp_mode", default=None)
    p.add_argument("--mtp_step", type=int, default=0)
    p.add_argument("--disable_overlap", action="store_true")
    p.add_argument("--engine_root", default=None, help="checkout whose lightllm_mtp is timed (default: this one)")
    p.add_argument("--label", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def build_engine(args):
    from lightllm_mtp.config.engine_args import EngineArgs
    from lightllm_mtp.engine.llm_engine import LLMEngine

    max_len = args.input_len + args.output_len + 16
    kw = dict(device=args.device, max_model_len=max_len, max_batch_size=args.concurrency,
              max_total_token_num=args.concurrency * max_len + 64 * (args.mtp_step + 1) * args.concurrency,
              chunked_prefill_size=args.chunked_prefill_size, graph_max_batch_size=args.concurrency)  # fmt: skip
    if args.disable_overlap:
        kw["disable_overlap"] = True
    if "prefix_cache" in EngineArgs.__dataclass_fields__:  # random prompts: comparable with engines without the cache
        kw["prefix_cache"] = False
    if args.mtp_mode:
        kw.update(mtp_mode=args.mtp_mode, mtp_step=args.mtp_step)
    if args.model_dir:
        return LLMEngine(EngineArgs(model_dir=args.model_dir, **kw))
    sys.path.insert(0, str(REPO))
    from benchmark.model_shapes import MODEL_SHAPES

    with tempfile.TemporaryDirectory(prefix="mixed_shape_") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(MODEL_SHAPES[args.model_shape]))
        return LLMEngine(EngineArgs(model_dir=tmp, load_format="dummy", **kw))


def run_closed_loop(engine, args, num_requests: int, rng: random.Random) -> dict:
    from lightllm_mtp.sampling_params import SamplingParams

    import torch

    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_new_tokens=args.output_len, ignore_eos=True)
    pending = [[rng.randrange(vocab) for _ in range(args.input_len)] for _ in range(num_requests)]
    live, done, tokens, step_times = [], 0, 0, []
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = last = time.perf_counter()
    while pending or live:
        while pending and len(live) < args.concurrency:
            live.append(engine.add_request(pending.pop(), params))
        outputs = engine.step_outputs()
        now = time.perf_counter()
        step_times.append((now - last) * 1e3)
        last = now
        tokens += sum(len(o.new_token_ids) for o in outputs)
        finished = {id(o.request) for o in outputs if o.finished}
        done += len(finished)
        live = [r for r in live if id(r) not in finished]
    wall = time.perf_counter() - t0
    step_times.sort()
    return {
        "requests": done,
        "steps": len(step_times),
        "wall_s": wall,
        "steps_per_s": len(step_times) / wall,
        "output_tokens": tokens,
        "output_tok_per_s": tokens / wall,
        "step_ms_p50": step_times[len(step_times) // 2],
        "step_ms_p90": step_times[int(len(step_times) * 0.9)],
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    root = Path(args.engine_root).resolve() if args.engine_root else REPO
    sys.path.insert(0, str(root))
    import lightllm_mtp

    engine_file = str(Path(lightllm_mtp.__file__).resolve())
    assert engine_file.startswith(str(root)), f"lightllm_mtp imported from {engine_file}, not {root}"
    engine = build_engine(args)
    rng = random.Random(args.seed)
    run_closed_loop(engine, args, args.concurrency, rng)  # warm-up: Triton autotuning, allocator
    result = run_closed_loop(engine, args, args.num_requests, rng)
    report = {
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "label": args.label,
        "engine_root": str(root),
        "config": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "result": result,
    }
    print(json.dumps(report["result"], indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
