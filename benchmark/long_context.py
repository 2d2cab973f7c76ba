"""Long-context benchmark (issue 33): one request at each context length, B = 1, through the engine.

    python benchmark/long_context.py --model_shape qwen3.5-27b --device cuda --lengths 131072,262144,524288,1048576 \
        --real_prefill 131072 [--mtp_mode eagle_with_att --mtp_step 1 --mtp_force_acceptance mean=1.8] \
        [--mtp_adaptive --accept_rates 0.8,0.6] --out benchmark/results/long_context_27b_h200.json

For each length L (positions past the model's max_position_embeddings take YaRN, `--rope_scaling` or automatically
factor 2 / 4 over it):
- `attention_kernel`: the prefill attention kernel alone (one layer's heads, bf16, scattered pool slots) on a chunk of
  C = --chunk queries at depth L - C: ms, TFLOP/s (causal FLOPs 4 x Hq x D x the rows' key counts) and its share of the
  measured bf16 matmul peak;
- `prefill` (L in --real_prefill): the whole prompt through the engine, wall time until its first token: tokens/s;
- otherwise a synthetic context: the request's KV slots of positions 0..L-C-1 are planted (distinct pool slots; with
  random weights their contents do not matter), then its last C prompt tokens run for real (`last_chunk`: that
  forward's ms and tokens/s, the prefill's cost at depth L);
- `decode`: --decode_steps steps at that context, each timed between returns of LLMEngine.step (no synchronize: the
  steady state of overlap scheduling), median ms, and the floor (benchmark/floor.py: weights + the KV of L tokens +
  GDN state over the measured copy bandwidth). Under MTP these are verify steps (`mtp_step`; the step cost in decode
  steps is their median over the plain run's `decode` median at the same length: docs/long_context.md);
- `adaptive` (--mtp_adaptive): the step-cost table the engine timed at start-up (with its per-context-token term) and
  the k its controller picks at each length for each per-position acceptance of --accept_rates.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmark` and `lightllm_mtp` importable from the repo
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmark.floor import floor_ms, spec_bytes, step_bytes
from benchmark.model_source import build_engine, resolve_source
from benchmark.timing import (ForwardTimer, calls_ms, device_info, measure_copy_bandwidth, measure_matmul_peak,
                              summary, sync, versions)  # fmt: skip
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.kernels.attention.prefill_attention import prefill_attention
from lightllm_mtp.models.registry import model_class
from lightllm_mtp.sampling_params import SamplingParams
from lightllm_mtp.spec_decode.adaptive import AcceptanceEstimate


def attention_kernel(cfg, lengths: list[int], chunk: int, device: torch.device, dtype: torch.dtype,
                     peak: dict | None) -> list[dict]:  # fmt: skip
    """The prefill attention kernel on a chunk of `chunk` queries at depth L - chunk, for each L."""
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    size = max(lengths) + 8
    k_buf = torch.randn(size, hkv, d, device=device, dtype=dtype)
    v_buf = torch.randn(size, hkv, d, device=device, dtype=dtype)
    table = torch.randperm(size, device=device)[: max(lengths)].to(torch.int32)[None]  # scattered slots
    q = torch.randn(chunk, hq, d, device=device, dtype=dtype)
    req = torch.zeros(1, dtype=torch.int32, device=device)
    cu = torch.tensor([0, chunk], dtype=torch.int32, device=device)
    out = []
    for length in lengths:
        seq = torch.tensor([length], dtype=torch.int32, device=device)

        def run():
            return prefill_attention(q, k_buf, v_buf, table, req, cu, seq, d**-0.5, max_q_len=chunk)

        run()
        sync(device)
        start = time.perf_counter()
        iters = 5 if device.type == "cuda" else 1
        for _ in range(iters):
            run()
        sync(device)
        ms = (time.perf_counter() - start) * 1e3 / iters
        flops = 4 * hq * d * (chunk * (length - chunk) + chunk * (chunk + 1) // 2)
        row = {"length": length, "chunk": chunk, "ms_per_layer": ms, "tflops": flops / (ms / 1e3) / 1e12}
        if peak:
            row["pct_of_matmul_peak"] = row["tflops"] / peak["tflops"] * 100.0
        out.append(row)
    del k_buf, v_buf, table, q
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def plant_context(engine: LLMEngine, req, depth: int) -> None:
    """The request holds a request slot and KV slots for positions 0..depth-1 as if its prompt had been read so far."""
    runner = engine.model_runner
    req.req_idx = runner.req_manager.alloc()
    slots = runner.kv_pool.alloc(depth)
    table = runner.req_manager.req_to_token
    table[req.req_idx, :depth] = slots.to(table.device)
    req.kv_slots = [slots]
    req.num_computed = depth


def run_length(engine: LLMEngine, cfg, length: int, args, real: bool, timer: ForwardTimer, bw: dict, specs,
               dtype) -> dict:  # fmt: skip
    dev, k = engine.args.device, (args.mtp_step if args.mtp_mode else 0)
    gen = torch.Generator().manual_seed(length)
    prompt = torch.randint(0, cfg.vocab_size, (length,), generator=gen).tolist()
    params = SamplingParams(temperature=0.0, max_new_tokens=args.decode_steps * (k + 1) + 2 * k + 4, ignore_eos=True)
    req = engine.add_request(prompt, params)
    if not real:
        plant_context(engine, req, length - args.chunk)
    row: dict = {"length": length, "synthetic_context": not real}
    sync(dev)
    timer.take()
    start = time.perf_counter()
    while req.in_prefill:
        engine.step()
    sync(dev)
    wall = (time.perf_counter() - start) * 1e3
    prompt_forwards = -(-length // args.chunk) if real else 1  # the forwards after them: steps queued by overlap
    chunk_ms, forwards = calls_ms(timer.take()[:prompt_forwards])
    if real:
        row["prefill"] = {"ms": wall, "tokens_per_s": length / (wall / 1e3), "forwards": forwards}
    else:
        row["last_chunk"] = {"tokens": args.chunk, "forward_ms": chunk_ms, "forwards": forwards, "wall_ms": wall,
                             "tokens_per_s": args.chunk / (chunk_ms / 1e3)}  # fmt: skip
    steps, last = [], time.perf_counter()
    while engine.has_unfinished():
        engine.step()
        now = time.perf_counter()
        steps.append((now - last) * 1e3)
        last = now
    stats = summary(steps[1:-1])  # the first overlaps the prompt's last step, the last one ends the request
    if stats is not None:
        b = step_bytes(cfg, specs, dtype, 1, length, rows_per_req=k + 1)
        fl = floor_ms(b.total, bw["bytes_per_s"])
        stats.update(floor_label=bw["floor_label"], bytes_per_step=b.total, kv_bytes=b.kv_cache,
                     floor_ms=fl, pct_of_floor=fl / stats["median_ms"] * 100.0)  # fmt: skip
    row["decode" if not k else "mtp_step"] = stats
    if k:
        s = req.spec_stats
        row["tokens_per_step"] = 1 + s.accepted_drafts / s.verify_steps if s.verify_steps else None
    return row


def adaptive_choices(engine: LLMEngine, lengths: list[int], rates: list[float]) -> dict:
    controller = engine.spec_controller
    costs, k = controller.costs, controller.max_drafts
    out = {"batch_sizes": costs.batch_sizes, "cost_ms_by_k": costs.cost_ms,
           "ms_per_context_token_by_k": costs.ms_per_context_token, "choices": []}  # fmt: skip
    for rate in rates:
        est = AcceptanceEstimate(reached=[10.0] * k, accepted=[10.0 * rate] * k)  # settled on `rate` at each position
        for length in lengths:
            out["choices"].append({"accept_rate": rate, "length": length, "k": controller.best([est], length),
                                   "cost_ms_by_k": costs.row(1, length)})  # fmt: skip
    return out


def rope_scaling_for(cfg, max_len: int, given: str | None) -> dict | None:
    if given:
        return json.loads(given)
    if max_len <= cfg.max_context_len:
        return None
    factor = 2 ** math.ceil(math.log2(max_len / cfg.max_position_embeddings))
    return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": cfg.max_position_embeddings}


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model_dir")
    src.add_argument("--model_shape")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lengths", type=_ints, required=True, help="context lengths (tokens), comma list")
    p.add_argument("--real_prefill", type=_ints, default=[],
                   help="lengths whose whole prompt runs (the others: a synthetic context)")
    p.add_argument("--chunk", type=int, default=4096, help="chunked_prefill_size, and the synthetic last chunk")
    p.add_argument("--decode_steps", type=int, default=16)
    p.add_argument("--rope_scaling", default=None, help="JSON (default: YaRN over max_position_embeddings when needed)")
    p.add_argument("--mtp_mode", default=None)
    p.add_argument("--mtp_step", type=int, default=1)
    p.add_argument("--mtp_force_acceptance", default=None)
    p.add_argument("--mtp_adaptive", action="store_true")
    p.add_argument("--accept_rates", type=lambda s: [float(x) for x in s.split(",")], default=[0.8, 0.6])
    p.add_argument("--skip_attention_kernel", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if min(args.lengths) <= args.chunk or any(x not in args.lengths for x in args.real_prefill):
        p.error("every length must exceed --chunk, and --real_prefill must be among --lengths")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = "python " + " ".join(sys.argv if argv is None else ["benchmark/long_context.py", *argv])
    source = resolve_source(args)
    cfg, device = source.cfg, torch.device(args.device)
    k = args.mtp_step if args.mtp_mode else 0
    max_len = max(args.lengths) + (args.decode_steps + 4) * (k + 1) + 64
    scaling = rope_scaling_for(cfg, max_len, args.rope_scaling)
    bw = measure_copy_bandwidth(device, 20)
    peak = measure_matmul_peak(device)
    report = {"command": command, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": device_info(device),
              "versions": versions(), "bandwidth": bw, "matmul_peak": peak, "model": source.name,
              "settings": {"lengths": args.lengths, "real_prefill": args.real_prefill, "chunk": args.chunk,
                           "max_model_len": max_len, "rope_scaling": scaling, "batch_size": 1}}  # fmt: skip
    probe_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if not args.skip_attention_kernel:
        report["attention_kernel"] = attention_kernel(cfg, args.lengths, args.chunk, device, probe_dtype, peak)
    extra = {"rope_scaling": scaling, "chunked_prefill_size": args.chunk}
    if args.mtp_mode:
        extra["mtp_adaptive"] = args.mtp_adaptive
    settings = argparse.Namespace(model_dir=args.model_dir, model_shape=args.model_shape, seed=args.seed,
                                  device=args.device, dtype=args.dtype, batch_sizes=[1], chunked_prefill_size=None,
                                  graph_max_batch_size=None, mtp_mode=args.mtp_mode, mtp_step=args.mtp_step,
                                  mtp_force_acceptance=args.mtp_force_acceptance, engine_extra=extra)  # fmt: skip
    engine = build_engine(source, settings, max_len, mtp=bool(args.mtp_mode))
    dtype = engine.args.dtype
    specs = model_class(cfg).weight_specs(cfg)
    report["settings"].update(kv_pool_tokens=engine.scheduler.kv_capacity, dtype=str(dtype).removeprefix("torch."),
                              weight_bytes=sum(spec_bytes(s, dtype) for s in specs))  # fmt: skip
    if device.type == "cuda":
        report["settings"]["memory_allocated_GiB"] = torch.cuda.memory_allocated(device) / 2**30
    timer = ForwardTimer(engine.model_runner, device)
    report["lengths"] = []
    for length in args.lengths:
        row = run_length(engine, cfg, length, args, length in args.real_prefill, timer, bw, specs, dtype)
        report["lengths"].append(row)
        print(json.dumps(row), flush=True)
    if args.mtp_adaptive:
        report["adaptive"] = adaptive_choices(engine, args.lengths, args.accept_rates)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
