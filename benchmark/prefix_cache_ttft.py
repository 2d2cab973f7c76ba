"""Time to first token, cold vs warm prefix cache: a long shared prefix plus a short question (issue 16's target:
an 8k prefix + 128-token question, warm at least 10x faster than cold on an H100 at the 27B shape).

    python benchmark/prefix_cache_ttft.py --model_shape qwen3.5-27b --device cuda --prefix_len 8192 \
        --question_len 128 --mtp_mode eagle_with_att --mtp_step 1 --out benchmark/results/prefix_cache_ttft.json

Per repeat: a cold request (a fresh prefix), then warm requests (the same prefix, new questions), each alone with
max_new_tokens=1, so its wall time is its TTFT; and the same warm prompts on an engine without the cache. Each engine
first runs a cold prefix and a hit on it, unmeasured (compilation and autotuning of both paths' shapes). Under MTP
(draft lookahead L = 1) a warm request resumes at the deepest snapshot at most prefix_len - 1 (the draft KV of the
prefix's last position depends on the question's first token): with interval I it recomputes up to I + question_len.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmark.model_source import add_source_args, build_engine, engine_settings, resolve_source  # noqa: E402
from benchmark.static_inference import free_device_memory  # noqa: E402
from benchmark.timing import result_header, sync, sync_sites, write_json  # noqa: E402
from lightllm_mtp.sampling_params import SamplingParams  # noqa: E402


def ttft_ms(engine, prompt: list[int]) -> tuple[float, int]:
    """Wall time of one request alone until its first token; the prompt tokens it resumed past."""
    sync(engine.args.device)
    start = time.perf_counter()
    req = engine.add_request(prompt, SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    sync(engine.args.device)
    return (time.perf_counter() - start) * 1e3, req.num_cached_tokens


def python_profile(engine, prompt: list[int], top: int = 45) -> dict:
    """One request under cProfile: the Python functions by their own time and by cumulative time, to say which host
    code a request's steps spend their wall time in (cProfile slows Python down; compare the functions, not the sum)."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    total, _ = ttft_ms(engine, prompt)
    profiler.disable()
    tables = {}
    for key in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(top)
        tables[key] = text.getvalue()
    return {"ttft_ms_cprofiled": total, "by_own_time": tables["tottime"], "by_cumulative_time": tables["cumulative"]}


def request_breakdown(engine, prompt: list[int]) -> dict:
    """One request under torch.profiler: engine steps (host wall per step), host time in the prefix cache's
    methods, and the top device kernels / host ops, to say where a TTFT goes."""
    from torch.profiler import ProfilerActivity, profile

    cache, host = engine.prefix_cache, {}
    originals = {}
    for name in ("match", "admitted", "restore", "plan", "after_launch", "on_finish") if cache else ():
        originals[name] = fn = getattr(cache, name)

        def timed(*a, _fn=fn, _name=name, **kw):
            t = time.perf_counter()
            try:
                return _fn(*a, **kw)
            finally:
                host[_name] = host.get(_name, 0.0) + (time.perf_counter() - t) * 1e3

        setattr(cache, name, timed)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.args.device.type == "cuda" else [])
    steps = []
    sync(engine.args.device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True))
        while engine.has_unfinished():
            t = time.perf_counter()
            engine.step()
            steps.append((time.perf_counter() - t) * 1e3)
        sync(engine.args.device)
        total = (time.perf_counter() - start) * 1e3
    for name, fn in originals.items():
        setattr(cache, name, fn)
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    return {
        "ttft_ms_profiled": total,
        "step_host_ms": steps,
        "prefix_cache_host_ms": host,
        "device_kernel_ms": device_us / 1e3,
        "top_device": events.table(sort_by="self_cuda_time_total", row_limit=25) if len(activities) > 1 else "",
        "top_host": events.table(sort_by="self_cpu_time_total", row_limit=15),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_args(p)
    p.add_argument("--prefix_len", type=int, default=8192)
    p.add_argument("--question_len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warm_per_repeat", type=int, default=2)
    p.add_argument("--chunked_prefill_size", type=int, default=8192)
    p.add_argument("--prefix_cache_interval", type=int, default=256)
    p.add_argument("--prefix_cache_state_share", type=float, default=0.5)
    p.add_argument("--max_total_token_num", type=int, default=None,
                   help="the KV + snapshot budget in KV tokens (default 2 x max_model_len: two requests' KV)")
    p.add_argument("--mtp_mode", default=None)
    p.add_argument("--mtp_step", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--breakdown", action="store_true", help="profile a cold request (both engines) and warm ones: torch.profiler, then cProfile")
    p.add_argument("--sync_sites", action="store_true",
                   help="a cold and a warm request under CUDA's sync debug mode: where the host waits on the device")
    p.add_argument("--no_prefill_graphs", action="store_true",
                   help="prompt chunks run eagerly (LLM(prefill_cuda_graphs=False)): the A/B of the prefill graphs")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    ns = engine_settings(args, 2, chunked_prefill_size=args.chunked_prefill_size, mtp_layers=max(1, args.mtp_step),
                         mtp_mode=args.mtp_mode, mtp_step=args.mtp_step)
    source = resolve_source(ns)
    max_model_len = args.prefix_len + args.question_len + 64
    gen = torch.Generator().manual_seed(args.seed)
    vocab = source.cfg.vocab_size

    def tokens(n):
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    prompts = []  # per repeat: the cold prompt, then the warm ones
    for _ in range(args.repeats):
        prefix = tokens(args.prefix_len)
        prompts.append([prefix + tokens(args.question_len) for _ in range(1 + args.warm_per_repeat)])
    rows = {}
    for label, cache in (("cache", True), ("no_cache", False)):
        ns.engine_extra = dict(prefix_cache=cache, prefix_cache_interval=args.prefix_cache_interval,
                               prefix_cache_state_share=args.prefix_cache_state_share,
                               prefill_cuda_graphs=not args.no_prefill_graphs)  # fmt: skip
        if args.max_total_token_num:
            ns.engine_extra["max_total_token_num"] = args.max_total_token_num
        engine = build_engine(source, ns, max_model_len, mtp=args.mtp_mode is not None)
        budget = engine.cache_budget
        print(label, f"KV pool {budget.kv_tokens} tokens, {budget.num_snapshots} snapshots of "
              f"{budget.snapshot_bytes / 2**20:.0f} MiB", flush=True)  # fmt: skip
        # warm-up of both paths' shapes (compilation, autotuning, allocator): a cold prefix, then a hit on it
        warm_up = tokens(args.prefix_len)
        for _ in range(2):
            ttft_ms(engine, warm_up + tokens(args.question_len))
        cold, warm, cached = [], [], []
        for batch in prompts:
            t, _ = ttft_ms(engine, batch[0])
            cold.append(t)
            for prompt in batch[1:]:
                t, c = ttft_ms(engine, prompt)
                warm.append(t)
                cached.append(c)
        rows[label] = {"kv_tokens": budget.kv_tokens, "snapshots": budget.num_snapshots, "cold_ms": cold,
                       "warm_ms": warm, "warm_cached_tokens": cached, "cold_median_ms": statistics.median(cold),
                       "warm_median_ms": statistics.median(warm)}  # fmt: skip
        if args.breakdown:  # a fresh prefix (cold), then on the cache its prefix again with new questions (warm)
            fresh = tokens(args.prefix_len)
            b = rows[label]["cold_breakdown"] = request_breakdown(engine, fresh + tokens(args.question_len))
            print(b["top_device"], {k: v for k, v in b.items() if not k.startswith("top")}, sep="\n")
            if cache:
                b = rows[label]["warm_breakdown"] = request_breakdown(engine, fresh + tokens(args.question_len))
                print(b["top_device"], b["top_host"], {k: v for k, v in b.items() if not k.startswith("top")}, sep="\n")
                b = rows[label]["warm_python_profile"] = python_profile(engine, fresh + tokens(args.question_len))
                print(b["by_own_time"], b["by_cumulative_time"], sep="\n")
        if args.sync_sites:
            fresh = tokens(args.prefix_len)
            for kind in ("cold", "warm") if cache else ("cold",):
                _, sites = sync_sites(functools.partial(ttft_ms, engine, fresh + tokens(args.question_len)))
                rows[label][f"{kind}_sync_sites"] = sites
                print(label, kind, "sync sites", json.dumps(sites, indent=1), flush=True)
        print(label, json.dumps({k: v for k, v in rows[label].items() if "median" in k}), flush=True)
        del engine
        free_device_memory(torch.device(args.device))
    c = rows["cache"]
    report = {
        **result_header("benchmark/prefix_cache_ttft.py", argv, args, torch.device(args.device)),
        "results": rows,
        "warm_speedup_vs_cold": c["cold_median_ms"] / c["warm_median_ms"],
        "warm_speedup_vs_no_cache": rows["no_cache"]["warm_median_ms"] / c["warm_median_ms"],
    }
    print(f"warm {c['warm_median_ms']:.1f} ms vs cold {c['cold_median_ms']:.1f} ms: "
          f"{report['warm_speedup_vs_cold']:.1f}x", flush=True)  # fmt: skip
    write_json(report, args.out)
    return report


if __name__ == "__main__":
    main()
