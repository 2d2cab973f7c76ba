"""mem_fraction on a real GPU: build the engine at a published shape (random weights) with --mem_fraction, fill its KV
pool with long requests (MTP on, prefix cache on), and report the KV tokens and snapshots it got, the peak memory the
process reserved and the fraction of the GPU in use at the end. The plan (engine/memory_budget.py) is right when the
peak stays under mem_fraction of the GPU and the pool is not far below what is left.

    python benchmark/check_mem_fraction_gpu.py --model_shape qwen3.5-27b --mem_fraction 0.9 --out result.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmark.model_shapes import MODEL_SHAPES  # noqa: E402
from lightllm_mtp.config.engine_args import EngineArgs  # noqa: E402
from lightllm_mtp.engine.llm_engine import LLMEngine  # noqa: E402
from lightllm_mtp.sampling_params import SamplingParams  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_shape", default="qwen3.5-27b", choices=sorted(MODEL_SHAPES))
    p.add_argument("--mem_fraction", type=float, default=0.9)
    p.add_argument("--max_model_len", type=int, default=8192)
    p.add_argument("--max_batch_size", type=int, default=32)
    p.add_argument("--mtp_step", type=int, default=1)
    p.add_argument("--prompt_len", type=int, default=4000)
    p.add_argument("--output_len", type=int, default=64)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    command = "python " + " ".join(sys.argv if argv is None else ["benchmark/check_mem_fraction_gpu.py", *argv])
    free0, total = torch.cuda.mem_get_info()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(MODEL_SHAPES[args.model_shape]))
        engine = LLMEngine(EngineArgs(model_dir=tmp, device="cuda", load_format="dummy", mem_fraction=args.mem_fraction,
                                      max_model_len=args.max_model_len, max_batch_size=args.max_batch_size,
                                      mtp_mode="eagle_with_att", mtp_step=args.mtp_step))  # fmt: skip
    budget = engine.cache_budget
    after_load = torch.cuda.mem_get_info()[0]
    gen = torch.Generator().manual_seed(0)
    vocab = engine.model_config.vocab_size
    # as many full-length requests as the pool holds, then more: the scheduler queues what does not fit
    n = max(1, budget.kv_tokens // (args.prompt_len + args.output_len)) + 4
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    start = time.perf_counter()
    reqs = [engine.add_request(torch.randint(0, vocab, (args.prompt_len,), generator=gen).tolist(), params)
            for _ in range(n)]  # fmt: skip
    peak_running = 0
    while engine.has_unfinished():
        engine.step()
        peak_running = max(peak_running, len(engine.scheduler.running))
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    free_end = torch.cuda.mem_get_info()[0]
    result = {
        "command": command,
        "device": torch.cuda.get_device_name(),
        "model_shape": args.model_shape,
        "mem_fraction": args.mem_fraction,
        "gpu_total_bytes": total,
        "free_before_bytes": free0,
        "free_after_load_bytes": after_load,
        "kv_tokens": budget.kv_tokens,
        "snapshots": budget.num_snapshots,
        "cache_bytes": budget.total_bytes,
        "requests": n,
        "all_finished": all(r.finish_reason is not None for r in reqs),
        "peak_running": peak_running,
        "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(),
        "used_fraction_at_end": (total - free_end) / total,
        "peak_reserved_fraction": torch.cuda.max_memory_reserved() / total,
        "elapsed_s": elapsed,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
