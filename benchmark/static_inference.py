"""Static-batch inference benchmark: prefill and decode-step timing through the engine, against the memory floor
(the bytes a step must move over the measured copy bandwidth; named after the device: "H200 HBM floor", on CPU
"host memory-copy floor (cpu)").

    python benchmark/static_inference.py --model_shape qwen3.5-27b --batch_sizes 1,8,32 --input_len 1024 \
        --output_len 64 --device cuda [--mtp_mode eagle_with_att --mtp_step 1 --mtp_accept_rate 0.95] \
        [--mtp_force_acceptance mean=2.2] \
        [--hf_peer] [--out benchmark/results/NAME.json] [--plot]

For each batch size, bs requests of input_len random token ids go through LLMEngine.step (greedy, ignore_eos,
max_new_tokens=output_len): one warm-up generation, then a timed one. Prefill = every step until the last
prompt is complete; decode = the steps in which all bs requests run one decode row (under MTP one full verify
block each), each timed as the time between consecutive returns of LLMEngine.step, no synchronize in between: host
work, CUDA-graph replay and overlap scheduling are in). The KV pool admits the largest batch whole, lookahead
reservation included (model_source.kv_pool_tokens); a batch size that still gets no such step says why on the
terminal. See benchmark/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmark` and `lightllm_mtp` importable from the repo
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tqdm import tqdm

from benchmark.floor import floor_ms, parallel_floor, prefill_gemm_flops, spec_bytes, step_bytes, stored
from benchmark.hf_peer import build_hf_model, time_hf_generate
from benchmark.model_shapes import MODEL_SHAPES
from benchmark.model_source import ModelSource, build_engine, engine_field_names, resolve_source
from benchmark.report import plot_unavailable, print_tables, write_plot
from benchmark.static_generation import GenRecord, generate
from benchmark.timing import (
    ForwardTimer,
    MultiTimer,
    device_info,
    measure_copy_bandwidth,
    measure_matmul_peak,
    percentile,
    summary,
    versions,
)
from lightllm_mtp import env
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.forced_acceptance import ForcedAcceptance
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.engine.parallel.driver_runner import DriverRunner
from lightllm_mtp.env import ENV
from lightllm_mtp.models.registry import model_class

RESULTS_DIR = Path(__file__).resolve().parent / "results"
KV_SLACK = 8  # extra token slots per request beyond input_len + output_len (+ mtp_step)


# ---- the benchmark ---------------------------------------------------------------------------------------
def no_spec_result(rec: GenRecord, args, cfg, specs, dtype, bw: dict) -> dict:
    bs = rec.batch_size
    prompt_tokens = bs * args.input_len
    res = {
        "batch_size": bs,
        "prefill": {
            "ms": rec.prefill_ms,
            "tokens_per_s": prompt_tokens / (rec.prefill_ms / 1e3) if rec.prefill_ms else None,
            "forwards": rec.prefill_forwards,
            "prompt_tokens": prompt_tokens,
            "gemm_flops": prefill_gemm_flops(cfg, specs, prompt_tokens),
        },
        "decode": None,
        "e2e": {"ms": rec.e2e_ms, "output_tokens_per_s": bs * args.output_len / (rec.e2e_ms / 1e3)},
        "floor": None,
    }
    peak = bw.get("matmul_peak")
    if peak and rec.prefill_ms:  # GEMM FLOPs / wall / peak: the prefill's fraction of its floor
        res["prefill"]["gemm_pct_of_matmul_peak"] = (
            res["prefill"]["gemm_flops"] / (rec.prefill_ms / 1e3) / (peak["tflops"] * 1e12) * 100.0
        )
    stats = summary(rec.step_ms)
    if stats is None:
        res["decode_note"] = f"no full-batch decode step: {rec.no_full_step_reason}"
        return res
    stats["tokens_per_s"] = bs / (stats["median_ms"] / 1e3)
    res["decode"] = stats
    context = sum(rec.step_context) / len(rec.step_context)
    b = step_bytes(cfg, specs, dtype, bs, context, **stored(args, cfg))
    fl = floor_ms(b.total, bw["bytes_per_s"])
    res["floor"] = {
        "label": bw["floor_label"],
        "mean_context": context,
        "bytes_per_step": b.total,
        "breakdown": b.to_dict(),
        "floor_ms": fl,
        "pct_of_floor": fl / stats["median_ms"] * 100.0,
        "achieved_GB_per_s": b.total / (stats["median_ms"] / 1e3) / 1e9,
    }
    if args.tp * args.pp > 1:
        res["floor_per_gpu"] = parallel_floor(cfg, model_class(cfg), dtype, bs, context, stats["median_ms"],
                                              bw["bytes_per_s"], tp=args.tp, pp=args.pp, **stored(args, cfg))
    return res


def tokens_per_step(rate: float, k: int) -> float:
    return sum(rate**i for i in range(k + 1))


def break_even_rate(cost_ratio: float, k: int) -> float | None:
    """Acceptance rate at which sum_{i<=k} rate^i equals the spec step's cost in no-spec steps."""
    if cost_ratio <= 1.0:
        return 0.0
    if cost_ratio > k + 1:
        return None  # not reachable even at rate 1
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if tokens_per_step(mid, k) < cost_ratio else (lo, mid)
    return 0.5 * (lo + hi)


def spec_result(rec: GenRecord, base: dict | None, args, cfg, specs, dtype, bw: dict) -> dict:
    bs, k = rec.batch_size, args.mtp_step
    res = {
        "batch_size": bs,
        "mode": args.mtp_mode,
        "mtp_step": k,
        "prefill": {"ms": rec.prefill_ms, "forwards": rec.prefill_forwards},
        "e2e_ms_with_these_weights": rec.e2e_ms,
        "observed_accepted_drafts_per_step": rec.accepted_per_step,
    }
    stats = summary(rec.step_ms)
    if stats is None:
        res["note"] = f"no full-batch verify step with {k} drafts per request: {rec.no_full_step_reason}"
        return res
    verify = percentile(rec.verify_ms, 50)
    draft = percentile(rec.draft_ms, 50)
    other = percentile([s - v - d for s, v, d in zip(rec.step_ms, rec.verify_ms, rec.draft_ms)], 50)
    res.update(
        spec_step=stats,
        verify_ms=verify,
        draft_ms=draft,
        draft_forwards_per_step=percentile(rec.draft_calls, 50),
        host_and_other_ms=other,
    )
    context = sum(rec.step_context) / len(rec.step_context)
    vb = step_bytes(cfg, specs, dtype, bs, context, rows_per_req=k + 1, **stored(args, cfg))
    vfl = floor_ms(vb.total, bw["bytes_per_s"])
    res["verify_floor"] = {"label": bw["floor_label"], "bytes": vb.total, "floor_ms": vfl, "pct_of_floor": vfl / verify * 100.0 if verify else None}
    if args.tp * args.pp > 1 and verify:
        res["verify_floor_per_gpu"] = parallel_floor(cfg, model_class(cfg), dtype, bs, context, verify,
                                                     bw["bytes_per_s"], k + 1, tp=args.tp, pp=args.pp,
                                                     **stored(args, cfg))  # fmt: skip
    base_ms = base["decode"]["median_ms"] if base and base.get("decode") else None
    if base_ms:
        res["step_cost_vs_decode"] = stats["median_ms"] / base_ms
        res["break_even_accept_rate"] = break_even_rate(stats["median_ms"] / base_ms, k)
    sims = []
    for rate in args.mtp_accept_rate:
        tps = tokens_per_step(rate, k)
        eff = bs * tps / (stats["median_ms"] / 1e3)
        comp = bs * tps / ((draft + verify) / 1e3) if draft + verify > 0 else None
        sims.append({
            "accept_rate": rate,
            "tokens_per_step": tps,
            "effective_tokens_per_s": eff,
            "effective_tokens_per_s_draft_plus_verify": comp,
            "speedup_vs_no_spec": eff / base["decode"]["tokens_per_s"] if base_ms else None,
        })  # fmt: skip
    res["simulated"] = sims
    if args.mtp_force_acceptance and rec.accepted_per_step is not None:  # the timed steps accepted at this rate
        tps = 1.0 + rec.accepted_per_step
        eff = bs * tps / (stats["median_ms"] / 1e3)
        res["forced"] = {
            "setting": args.mtp_force_acceptance,
            "tokens_per_step": tps,
            "effective_tokens_per_s": eff,
            "speedup_vs_no_spec": eff / base["decode"]["tokens_per_s"] if base_ms else None,
        }
    return res


def real_acceptance(args) -> dict:
    """Greedy MTP (the benchmark's drafting mode, k = 1..4) on held-out text through this engine
    (tools/eval_acceptance.py)."""
    from lightllm_mtp.tools.eval_acceptance import evaluate

    mode = "ptd" if args.parallel_drafting else args.mtp_mode
    steps = [1, 2, 3, 4]
    if mode == "vanilla_with_att":  # one module per draft
        steps = steps[: ModelConfig.from_model_dir(args.model_dir).mtp_num_hidden_layers]
    ns = argparse.Namespace(
        model_dir=args.model_dir, device=args.device, dtype=args.dtype, mtp_steps=steps, mtp_modes=[mode],
        num_prompts=8,
        prompt_tokens=128, max_new_tokens=64, max_batch_size=8, strict=True,
        argv=["--model_dir", args.model_dir, "--device", args.device, "--num_prompts", "8", "--mtp_modes", mode,
              "--strict"],
    )  # fmt: skip
    out = evaluate(ns)
    return {"method": "tools/eval_acceptance.py: 8 held-out prompts of 128 tokens, 64 greedy tokens each", **out}


def add_real_speedup(res: dict, real: dict, base: dict, k: int) -> None:
    """Effective tokens/s of the timed MTP step at the measured acceptance of mtp_step k."""
    measured = real["mtp"].get(str(k))
    if not measured or not res.get("spec_step") or not base.get("decode"):
        return
    tps = measured["tokens_per_step"]
    eff = res["batch_size"] * tps / (res["spec_step"]["median_ms"] / 1e3)
    res["real"] = {"tokens_per_step": tps, "acceptance_per_position": measured["acceptance_per_position"],
                   "effective_tokens_per_s": eff, "speedup_vs_no_spec": eff / base["decode"]["tokens_per_s"]}  # fmt: skip


def run_batches(engine, prompts_all, args, bar, label, timers=None, k=0) -> dict[int, GenRecord]:
    out = {}
    for bs in args.batch_sizes:
        prompts = prompts_all[:bs]
        bar.set_description(f"{label} bs={bs} warm-up")
        generate(engine, prompts, min(args.output_len, args.warmup_steps + 1 + k), timers, k)
        if timers is not None:
            for t in timers:
                t.take()
        bar.set_description(f"{label} bs={bs}")
        out[bs] = generate(engine, prompts, args.output_len, timers, k)
        bar.update(1)
    return out


def free_device_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_hf_peer(source: ModelSource, args, dtype, device, prompts_all, ours: dict, records, bar) -> dict:
    out: dict = {"batch_sizes": args.hf_batch_sizes, "runs": []}
    try:
        import transformers
        from transformers.utils import import_utils

        out["transformers"] = transformers.__version__
        for flag in ("is_flash_linear_attention_available", "is_causal_conv1d_available"):
            fn = getattr(import_utils, flag, None)
            out[flag] = bool(fn()) if fn is not None else None
        bar.set_description("HF peer: building")
        weights = source.weights(dtype, device)
        model = build_hf_model(source.hf_config, source.cfg, weights, device)
        del weights
    except Exception as e:  # noqa: BLE001 - reported in the JSON instead of ending the run
        out["error"] = f"building the HF model failed: {type(e).__name__}: {e}"
        bar.update(len(args.hf_batch_sizes))
        free_device_memory(device)
        return out
    for bs in args.hf_batch_sizes:
        bar.set_description(f"HF peer bs={bs}")
        try:
            prompts = torch.tensor(prompts_all[:bs], dtype=torch.long, device=device)
            r = time_hf_generate(model, prompts, args.output_len, args.hf_repeats)
            hf_tokens = r.pop("tokens")
            mine = ours.get(bs)
            if mine is not None:
                r["speedup_e2e"] = mine["e2e"]["output_tokens_per_s"] / r["e2e_output_tokens_per_s"]
                if mine.get("decode") and r.get("decode_tokens_per_s"):
                    r["speedup_decode"] = mine["decode"]["tokens_per_s"] / r["decode_tokens_per_s"]
                ours_tokens = records[bs].outputs
                prefix = [_common_prefix(a, b) for a, b in zip(ours_tokens, hf_tokens)]
                r["greedy_tokens_equal_frac"] = sum(p == args.output_len for p in prefix) / bs
                r["greedy_mean_common_prefix"] = sum(prefix) / bs
            else:
                r["speedup_note"] = f"batch size {bs} not in --batch_sizes: no engine figure to compare"
            out["runs"].append(r)
        except Exception as e:  # noqa: BLE001
            out["runs"].append({"batch_size": bs, "error": f"{type(e).__name__}: {e}"})
            free_device_memory(device)
        bar.update(1)
    del model
    free_device_memory(device)
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ---- CLI -------------------------------------------------------------------------------------------------
def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model_dir", help="checkpoint directory (the engine's normal loader)")
    src.add_argument("--model_shape", choices=sorted(MODEL_SHAPES), help="published shape, random weights")
    p.add_argument("--batch_sizes", type=_ints, default=[1, 8, 32])
    p.add_argument("--input_len", type=int, default=1024)
    p.add_argument("--output_len", type=int, default=64)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU), bfloat16, float16, float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup_steps", type=int, default=3, help="decode steps of the warm-up generation per batch size")
    p.add_argument("--chunked_prefill_size", type=int, default=None, help="token budget per forward (engine default)")
    p.add_argument("--graph_max_batch_size", type=int, default=None, help="CUDA-graph decode buckets (engine default; 0: eager)")
    p.add_argument("--disable_overlap", action="store_true",
                   help="the engine reads each step's tokens before queuing the next (no overlap scheduling)")
    p.add_argument("--quantization", choices=("none", "fp8"), default="none", help="fp8: FP8 projections, online")
    p.add_argument("--kv_cache_dtype", choices=("auto", "fp8"), default="auto", help="fp8: the target's KV in e4m3")
    p.add_argument("--bw_repeats", type=int, default=20)
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel ranks (GPUs cuda:0..tp*pp-1); timings are rank 0's")  # fmt: skip
    p.add_argument("--pp", type=int, default=1, help="pipeline stages")
    p.add_argument("--mtp_mode", default=None, help="eagle_with_att or vanilla_with_att")
    p.add_argument("--mtp_step", type=int, default=1)
    p.add_argument("--parallel_drafting", action="store_true", help="with eagle_with_att: PTD, one draft forward")
    p.add_argument("--mtp_layers", type=int, default=None,
                   help="--model_shape only: MTP modules of the random checkpoint (vanilla_with_att needs mtp_step)")
    p.add_argument("--mtp_accept_rate", type=_floats, default=[0.8], help="simulated per-position acceptance (comma list)")
    p.add_argument("--mtp_force_acceptance", default=None,
                   help="the engine accepts drafts without checking them (benchmarks only: outputs are not the model's), "
                        "at per-position rates ('0.8,0.6,0.4') or a mean accept length ('mean=2.2'), so that the timed "
                        "MTP steps of random weights emit tokens at that acceptance (config/forced_acceptance.py)")
    p.add_argument("--real_acceptance", action="store_true",
                   help="with --model_dir (a trained checkpoint with a tokenizer): measure real MTP acceptance (k=1..4) "
                        "on held-out standard-library text and report the speedup it gives at the timed step cost")
    p.add_argument("--hf_peer", action="store_true", help="also time HF transformers generate on the same weights")
    p.add_argument("--hf_batch_sizes", type=_ints, default=[1, 8])
    p.add_argument("--hf_repeats", type=int, default=1)
    p.add_argument("--out", default=None, help="JSON path (default benchmark/results/<name>.json)")
    p.add_argument("--plot", action="store_true",
                   help='PNG of decode step time vs batch size next to the JSON (matplotlib: pip install -e ".[bench]")')
    args = p.parse_args(argv)
    if not args.batch_sizes or min(args.batch_sizes) < 1:
        p.error("--batch_sizes must be positive integers")
    if args.input_len < 1 or args.output_len < 1:
        p.error("--input_len and --output_len must be >= 1")
    if any(not 0.0 <= r <= 1.0 for r in args.mtp_accept_rate):
        p.error("--mtp_accept_rate values must be in [0, 1]")
    if args.mtp_force_acceptance is not None:
        if not args.mtp_mode:
            p.error("--mtp_force_acceptance needs --mtp_mode")
        try:
            ForcedAcceptance.parse(args.mtp_force_acceptance, args.mtp_step)
        except ValueError as e:
            p.error(str(e))
    if args.real_acceptance and not (args.model_dir and args.mtp_mode):
        p.error("--real_acceptance needs --model_dir (a checkpoint with a tokenizer) and --mtp_mode")
    if args.plot and (missing := plot_unavailable()):
        p.error(missing)  # before any work: exit status 2
    args.batch_sizes = sorted(set(args.batch_sizes))
    return args


def draft_modules(engine: LLMEngine) -> list:
    """Rank 0's draft modules (under tp its shard's; none on the first of several pipeline stages)."""
    runner = engine.runner.runner if isinstance(engine.runner, DriverRunner) else engine.runner  # tp / pp: wrapped
    return runner.proposer.modules if runner.proposer is not None else []


def default_out(args, source: ModelSource) -> Path:
    name = f"{source.name}_in{args.input_len}_out{args.output_len}_bs{'-'.join(map(str, args.batch_sizes))}"
    if args.tp > 1 or args.pp > 1:
        name += f"_tp{args.tp}_pp{args.pp}"
    name += ("_online_fp8" if args.quantization == "fp8" else "") + ("_fp8kv" if args.kv_cache_dtype == "fp8" else "")
    if args.mtp_mode:
        name += f"_{args.mtp_mode}{'_ptd' if args.parallel_drafting else ''}_k{args.mtp_step}"
        if args.mtp_force_acceptance:
            name += "_forced"
    return RESULTS_DIR / f"{name}_{args.device.split(':')[0]}.json"


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = "python " + " ".join(sys.argv if argv is None else ["benchmark/static_inference.py", *argv])
    source = resolve_source(args)
    cfg = source.cfg
    device = torch.device(args.device)
    if device.type == "cpu":  # the engines it builds pick the same count (EngineArgs.cpu_threads: none)
        torch.set_num_threads(EngineArgs(model_dir="-").resolved_cpu_threads(cfg.hidden_size, 1))
    dtype = EngineArgs(model_dir="-", device=args.device, dtype=args.dtype).dtype
    out_path = Path(args.out) if args.out else default_out(args, source)
    max_bs = max(args.batch_sizes)
    max_model_len = args.input_len + args.output_len + (args.mtp_step if args.mtp_mode else 0) + KV_SLACK
    gen = torch.Generator().manual_seed(args.seed)
    num_prompts = max([max_bs, *(args.hf_batch_sizes if args.hf_peer else [])])
    prompts_all = torch.randint(0, cfg.vocab_size, (num_prompts, args.input_len), generator=gen).tolist()
    specs = model_class(cfg).weight_specs(cfg)

    mtp_supported = "mtp_mode" in engine_field_names()
    jobs = len(args.batch_sizes) * (1 + bool(args.mtp_mode and mtp_supported)) + 1
    jobs += len(args.hf_batch_sizes) if args.hf_peer else 0
    bar = tqdm(total=jobs, desc="copy bandwidth", disable=ENV.disable_progress_bars)
    bw = measure_copy_bandwidth(device, args.bw_repeats)
    bw["matmul_peak"] = measure_matmul_peak(device)
    bar.update(1)

    report: dict = {
        "command": command,
        "engine_env": {k: str(v) for k, v in dataclasses.asdict(env.ENV).items()},  # the LIGHTLLM_MTP_ settings in force, defaults included
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": device_info(device),
        "versions": versions(),
        "bandwidth": bw,
        "model": {
            "name": source.name,
            "source": source.model_dir or "random weights (benchmark/model_shapes.py)",
            "hf_config": source.hf_config,
            "weight_bytes": sum(spec_bytes(s, dtype, quant=stored(args, cfg)["quant"]) for s in specs),
            "num_params": sum(math.prod(s.shape) for s in specs),
        },
        "settings": {
            "batch_sizes": args.batch_sizes,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "dtype": str(dtype).replace("torch.", ""),
            "seed": args.seed,
            "warmup_steps": args.warmup_steps,
            "max_model_len": max_model_len,
            "sampling": "greedy, ignore_eos, max_new_tokens=output_len",
        },
    }

    bar.set_description("building engine")
    engine = build_engine(source, args, max_model_len, mtp=False)
    report["settings"]["engine_args"] = {k: str(v) for k, v in dataclasses.asdict(engine.args).items()}
    report["settings"]["kv_pool_tokens"] = engine.scheduler.kv_capacity
    records = run_batches(engine, prompts_all, args, bar, "decode")
    engine.shutdown()
    del engine
    free_device_memory(device)
    report["results"] = [no_spec_result(records[bs], args, cfg, specs, dtype, bw) for bs in args.batch_sizes]
    by_bs = {r["batch_size"]: r for r in report["results"]}

    if args.mtp_mode and not mtp_supported:
        report["mtp"] = {"skipped": "EngineArgs has no mtp_mode"}
    elif args.mtp_mode:
        bar.set_description("building MTP engine")
        engine = build_engine(source, args, max_model_len, mtp=True)
        timers = (
            ForwardTimer(engine.model_runner, device),
            MultiTimer([ForwardTimer(d, device) for d in draft_modules(engine)]),
        )
        mtp_kv_pool_tokens = engine.scheduler.kv_capacity
        spec_records = run_batches(engine, prompts_all, args, bar, "MTP", timers, k=args.mtp_step)
        engine.shutdown()
        del engine, timers
        free_device_memory(device)
        report["mtp"] = {
            "mode": args.mtp_mode,
            "mtp_step": args.mtp_step,
            "kv_pool_tokens": mtp_kv_pool_tokens,
            "accept_rates": args.mtp_accept_rate,
            "forced_acceptance": args.mtp_force_acceptance,
            "method": (
                "real SpecRunner steps (verify + draft passes + eagle chain + host work) timed per step; "
                "verify/draft split from CUDA events around model.forward / draft.forward; acceptance is "
                "simulated: tokens/step = sum_{i=0..k} rate^i (drafts of random weights are rarely accepted, "
                "so observed acceptance is reported separately and does not change the step cost); with "
                "--mtp_force_acceptance the timed steps themselves accept drafts at that rate, unchecked, and "
                "'forced' gives the tokens/s they emitted"
            ),
            "results": [
                spec_result(spec_records[bs], by_bs[bs], args, cfg, specs, dtype, bw) for bs in args.batch_sizes
            ],
        }

    if args.real_acceptance:
        bar.set_description("real acceptance")
        report["real_acceptance"] = real_acceptance(args)
        for r in report.get("mtp", {}).get("results", []):
            add_real_speedup(r, report["real_acceptance"], by_bs[r["batch_size"]], args.mtp_step)
    if args.hf_peer:
        report["hf_peer"] = run_hf_peer(source, args, dtype, device, prompts_all, by_bs, records, bar)
    bar.close()

    out_path.parent.mkdir(parents=True, exist_ok=True)
    if args.plot:
        report["plot"] = write_plot(report, out_path.with_suffix(".png"))
    out_path.write_text(json.dumps(report, indent=1) + "\n")
    print_tables(report)
    print(f"\nwrote {out_path}")
    return report


if __name__ == "__main__":
    main()
