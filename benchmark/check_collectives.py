"""The tensor-parallel collectives of one decode / verify step, timed through the engine's own calls
(common/parallel_state.py): `tp_all_reduce` of a [rows, hidden] activation, two per decoder layer (the mixer's and
the MLP's row-parallel outputs) and one for the vocab-parallel embedding, and `tp_all_gather_last` of the fp32
logits [rows, vocab / tp]. Each is timed back to back on the current stream (eager, CUDA events: launch included,
an upper bound on what the step's CUDA graph pays); the step's total is (2 x layers + 1) all-reduces + 1 all-gather.

    python benchmark/check_collectives.py --model_shape qwen3.5-27b --tp 2 [--rows 1,2,32,64] [--out F.json]

NCCL on CUDA (GPUs cuda:0..tp-1), gloo on CPU (--device cpu: the same code at the same shapes, slower)."""

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmark.model_shapes import MODEL_SHAPES
from lightllm_mtp.common.parallel_state import init_parallel_state, tp_all_gather_last, tp_all_reduce
from lightllm_mtp.config.parallel_config import ParallelConfig, RankInfo
from lightllm_mtp.server.launcher import free_port


def _time_us(op, device: torch.device, iters: int) -> float:
    for _ in range(3):
        op()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            op()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) * 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        op()
    return (time.perf_counter() - t0) * 1e6 / iters


def _worker(rank: int, args, port: int, queue) -> None:
    device = torch.device(f"cuda:{rank}" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=args.tp)  # fmt: skip
    init_parallel_state(RankInfo(ParallelConfig(tp=args.tp), rank))
    hf = MODEL_SHAPES[args.model_shape]
    hidden, vocab = hf["hidden_size"], hf["vocab_size"]
    rows_out = []
    for rows in args.rows:
        x = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16)
        logits = torch.randn(rows, -(-vocab // args.tp), device=device, dtype=torch.float32)
        reduce_us = _time_us(lambda: tp_all_reduce(x), device, args.iters)
        gather_us = _time_us(lambda: tp_all_gather_last(logits), device, args.iters)
        step_us = (2 * hf["num_hidden_layers"] + 1) * reduce_us + gather_us
        rows_out.append({"rows": rows, "all_reduce_us": reduce_us, "logits_all_gather_us": gather_us,
                         "per_step_us": step_us})  # fmt: skip
    if rank == 0:
        queue.put(rows_out)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--model_shape", default="qwen3.5-27b", choices=sorted(MODEL_SHAPES))
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 32, 64])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.tp < 2:
        raise SystemExit("--tp must be >= 2")
    if args.device == "cuda" and torch.cuda.device_count() < args.tp:
        raise SystemExit(f"--tp {args.tp} needs {args.tp} GPUs, {torch.cuda.device_count()} visible")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(args, free_port(), queue), nprocs=args.tp, join=True, start_method="spawn")
    rows = queue.get()
    hf = MODEL_SHAPES[args.model_shape]
    report = {
        "command": "python " + " ".join(shlex.quote(a) for a in ["benchmark/check_collectives.py",
                                                                 *(sys.argv[1:] if argv is None else argv)]),
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "backend": "nccl" if args.device == "cuda" else "gloo",
        "model_shape": args.model_shape, "tp": args.tp, "layers": hf["num_hidden_layers"],
        "method": "eager back-to-back calls of parallel_state's collectives, CUDA events; per step = (2 x layers + 1) "
                  "all-reduces + 1 logits all-gather",
        "results": rows,
    }  # fmt: skip
    for r in rows:
        print(f"{args.model_shape} tp={args.tp} rows={r['rows']}: all-reduce {r['all_reduce_us']:.1f} us, logits "
              f"all-gather {r['logits_all_gather_us']:.1f} us -> {r['per_step_us'] / 1e3:.2f} ms a step")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
