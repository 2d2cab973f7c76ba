"""What fits on one GPU: a published shape (random weights, e.g. qwen3.5-122b-a10b-fp8) built by the engine with
`mem_fraction`, then the KV tokens its pool got, the weights' measured bytes, and a short greedy generation at a few
batch sizes (the engine serves). For "the 122B-A10B in FP8 on one H200" (issue 31).

    python benchmark/kv_capacity.py --model_shape qwen3.5-122b-a10b-fp8 --mem_fraction 0.92 --mtp_step 1 \
        [--kv_cache_dtype fp8] [--batch_sizes 1,8] --out benchmark/results/NAME.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmark.model_shapes import MODEL_SHAPES
from benchmark.timing import result_header, write_json
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.sampling_params import SamplingParams


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model_shape", choices=sorted(MODEL_SHAPES), required=True)
    p.add_argument("--mem_fraction", type=float, default=0.92)
    p.add_argument("--max_model_len", type=int, default=32768)
    p.add_argument("--max_batch_size", type=int, default=8)
    p.add_argument("--mtp_step", type=int, default=0, help="eagle_with_att with this many drafts (0: no MTP)")
    p.add_argument("--kv_cache_dtype", default="auto")
    p.add_argument("--batch_sizes", default="1,8")
    p.add_argument("--input_len", type=int, default=1024)
    p.add_argument("--output_len", type=int, default=32)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    header = result_header("benchmark/kv_capacity.py", None, args, torch.device("cuda"))
    mtp = dict(mtp_mode="eagle_with_att", mtp_step=args.mtp_step) if args.mtp_step else {}
    free_before, total = torch.cuda.mem_get_info()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(MODEL_SHAPES[args.model_shape]))
        start = time.perf_counter()
        engine = LLMEngine(EngineArgs(model_dir=tmp, load_format="dummy", device="cuda", dtype="bf16",
                                      mem_fraction=args.mem_fraction, max_model_len=args.max_model_len,
                                      max_batch_size=args.max_batch_size, kv_cache_dtype=args.kv_cache_dtype,
                                      prefix_cache=False, **mtp))  # fmt: skip
        build_s = time.perf_counter() - start
    budget = engine.cache_budget
    result = dict(header, build_seconds=build_s, gpu_total_bytes=total, gpu_free_before_bytes=free_before,
                  allocated_after_build_bytes=torch.cuda.memory_allocated(), kv_pool_tokens=budget.kv_tokens,
                  kv_bytes_per_token=budget.kv_bytes_per_token, runs=[])  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    vocab = engine.model.cfg.vocab_size
    for bs in (int(b) for b in args.batch_sizes.split(",")):
        prompts = torch.randint(0, vocab, (bs, args.input_len), generator=gen).tolist()
        params = SamplingParams(temperature=0.0, max_new_tokens=args.output_len, ignore_eos=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        reqs = [engine.add_request(p_, params) for p_ in prompts]
        while engine.has_unfinished():
            engine.step_outputs()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        result["runs"].append(dict(batch_size=bs, seconds=seconds, output_tokens=sum(len(r.output_ids) for r in reqs),
                                   peak_allocated_bytes=torch.cuda.max_memory_allocated()))  # fmt: skip
        print(result["runs"][-1], flush=True)
    engine.shutdown()
    print({k: result[k] for k in ("kv_pool_tokens", "kv_bytes_per_token", "allocated_after_build_bytes")})
    write_json(result, args.out)


if __name__ == "__main__":
    main()
