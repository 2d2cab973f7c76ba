"""The multi-turn trace of `serving.py --workload multi_turn --resend ids`, driven on the engine directly, with every
step timed: says where a prefix-cached engine spends its steps (issue 16: the cached 27B server was slower at a 0.73
hit rate) without the HTTP server in the way.

    python benchmark/multi_turn_steps.py --model_shape qwen3.5-27b --device cuda --mtp_mode eagle_with_att \
        --mtp_step 1 --out benchmark/results/multi_turn_steps_qwen3.5-27b_h100.json

Conversations (a first prompt, then `turns - 1` user messages) run `concurrency` at a time; a finished turn's next
prompt is its prompt + the answer's token ids + a new user message, added before the next step (a closed loop with
no network). Per engine (cache on, then off) and per pass: wall time, steps, each step's wall split by kind
(decode / verify rows only, or with prompt chunks), prompt tokens computed, time inside the prefix cache's methods,
the host code that synchronizes with the device during the trace (`--sync_sites`, CUDA only), and the Triton kernels
compiled in each step (a kernel variant first met mid-trace costs its step up to seconds).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmark.model_source import add_source_args, build_engine, engine_settings, resolve_source  # noqa: E402
from benchmark.static_inference import free_device_memory  # noqa: E402
from benchmark.timing import TritonCompiles, result_header, summary, sync, sync_sites, write_json  # noqa: E402
from lightllm_mtp.engine.warm_up import warm_up as engine_warm_up  # noqa: E402
from lightllm_mtp.sampling_params import SamplingParams  # noqa: E402

CACHE_METHODS = ("match", "admitted", "restore", "plan", "after_launch", "on_finish")


class StepLog:
    """Wraps the runner's launch and the prefix cache's methods of one engine to log what each step queues."""

    def __init__(self, engine):
        self.launched: list[tuple[int, int, int]] = []  # per launch: decode rows, prompt chunks, prompt tokens
        self.cache_ms: dict[str, float] = collections.defaultdict(float)
        runner, launch = engine.runner, engine.runner.launch

        def logged_launch(scheduled, *a, **kw):
            chunks = [s for s in scheduled if s.request.in_prefill]
            self.launched.append((len(scheduled) - len(chunks), len(chunks), sum(s.num_new_tokens for s in chunks)))
            return launch(scheduled, *a, **kw)

        runner.launch = logged_launch
        for name in CACHE_METHODS if engine.prefix_cache is not None else ():
            fn = getattr(engine.prefix_cache, name)

            def timed(*a, _fn=fn, _name=name, **kw):
                t = time.perf_counter()
                try:
                    return _fn(*a, **kw)
                finally:
                    self.cache_ms[_name] += (time.perf_counter() - t) * 1e3

            setattr(engine.prefix_cache, name, timed)


def run_trace(engine, first: list[list[int]], user_turns: list[list[list[int]]], concurrency: int,
              output_len: int) -> dict:  # fmt: skip
    """Runs the conversations to their end; per step its wall time and what it launched."""
    log = StepLog(engine)
    params = SamplingParams(temperature=0.0, max_new_tokens=output_len, ignore_eos=True)
    todo = collections.deque(range(len(first)))
    live: dict[int, tuple[int, int, list[int], float]] = {}  # id(req) -> conversation, turn, prompt, arrival
    ttft, first_seen = [], set()

    def start(conv: int, turn: int, prompt: list[int]) -> None:
        live[id(engine.add_request(prompt, params))] = (conv, turn, prompt, time.perf_counter())

    def advance(outputs) -> None:
        now = time.perf_counter()
        for o in outputs:
            conv, turn, prompt, arrived = live[id(o.request)]
            if id(o.request) not in first_seen and o.new_token_ids:
                first_seen.add(id(o.request))
                ttft.append((now - arrived) * 1e3)
            if not o.finished:
                continue
            del live[id(o.request)]
            first_seen.discard(id(o.request))
            if turn + 1 < len(user_turns[conv]) + 1:
                start(conv, turn + 1, prompt + o.request.output_ids + user_turns[conv][turn])
            elif todo:
                c = todo.popleft()
                start(c, 0, first[c])

    while todo and len(live) < concurrency:
        c = todo.popleft()
        start(c, 0, first[c])
    steps = []
    sync(engine.args.device)
    t0 = time.perf_counter()
    with TritonCompiles() as compiles:
        while engine.has_unfinished():
            n_launched, n_compiles = len(log.launched), len(compiles.events)
            t = time.perf_counter()
            outputs = engine.step_outputs()
            wall = (time.perf_counter() - t) * 1e3
            steps.append({"ms": wall, "launched": log.launched[n_launched:], "compiles": compiles.events[n_compiles:]})
            advance(outputs)
    sync(engine.args.device)
    total = time.perf_counter() - t0
    with_chunks = [s["ms"] for s in steps if any(k[1] for k in s["launched"])]
    without = [s["ms"] for s in steps if s["launched"] and not any(k[1] for k in s["launched"])]
    return {
        "wall_s": total,
        "steps": len(steps),
        "mean_step_ms": total * 1e3 / max(1, len(steps)),
        "steps_launching_prompt_chunks": summary(with_chunks),
        "steps_launching_only_decode_rows": summary(without),
        "sum_ms_with_chunks": sum(with_chunks),
        "sum_ms_only_decode": sum(without),
        "prompt_tokens_computed": sum(k[2] for s in steps for k in s["launched"]),
        "decode_rows": sum(k[0] for s in steps for k in s["launched"]),
        "ttft_ms": summary(ttft),
        "prefix_cache_host_ms": dict(log.cache_ms),
        "compile_ms": sum(ms for s in steps for _, ms in s["compiles"]),
        "steps_with_compiles": [s for s in steps if s["compiles"]][:20],
        "slowest_steps": sorted(steps, key=lambda s: -s["ms"])[:12],
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_args(p)
    p.add_argument("--num_conversations", type=int, default=16)
    p.add_argument("--num_warmup", type=int, default=0, help="conversations run first, unmeasured (after the "
                   "engine's own start-up warm-up, engine/warm_up.py, as a server worker runs it)")
    p.add_argument("--no_engine_warm_up", action="store_true", help="skip engine/warm_up.py (the server's "
                   "--disable_warm_up)")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--input_len", type=int, default=1024)
    p.add_argument("--question_len", type=int, default=128)
    p.add_argument("--output_len", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max_model_len", type=int, default=8192)
    p.add_argument("--max_batch_size", type=int, default=16)
    p.add_argument("--chunked_prefill_size", type=int, default=4096)
    p.add_argument("--prefix_cache_interval", type=int, default=256)
    p.add_argument("--prefix_cache_state_share", type=float, default=None)
    p.add_argument("--mtp_mode", default=None)
    p.add_argument("--mtp_step", type=int, default=0)
    p.add_argument("--modes", default="cache,no_cache")
    p.add_argument("--passes", type=int, default=2,
                   help="measured passes, each with fresh conversations (the first may still compile kernel variants)")
    p.add_argument("--sync_sites", action="store_true", help="the last pass under CUDA's sync debug mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    ns = engine_settings(args, args.max_batch_size, chunked_prefill_size=args.chunked_prefill_size,
                         mtp_layers=max(1, args.mtp_step), mtp_mode=args.mtp_mode, mtp_step=args.mtp_step)
    source = resolve_source(ns)
    gen = torch.Generator().manual_seed(args.seed)
    vocab = source.cfg.vocab_size

    def conversations(n: int) -> tuple[list[list[int]], list[list[list[int]]]]:
        first = [torch.randint(0, vocab, (args.input_len,), generator=gen).tolist() for _ in range(n)]
        users = [[torch.randint(0, vocab, (args.question_len,), generator=gen).tolist() for _ in range(args.turns - 1)]
                 for _ in range(n)]  # fmt: skip
        return first, users

    warm_up = conversations(args.num_warmup)
    passes = [conversations(args.num_conversations) for _ in range(args.passes)]
    rows = {}
    for label in args.modes.split(","):
        ns.engine_extra = dict(prefix_cache=label == "cache", prefix_cache_interval=args.prefix_cache_interval,
                               prefix_cache_state_share=args.prefix_cache_state_share)  # fmt: skip
        engine = build_engine(source, ns, args.max_model_len, mtp=args.mtp_mode is not None)
        budget = engine.cache_budget
        print(label, f"KV pool {budget.kv_tokens} tokens, {budget.num_snapshots} snapshots", flush=True)
        t = time.perf_counter()
        if not args.no_engine_warm_up:
            with TritonCompiles() as compiles:
                engine_warm_up(engine)
        row = {"engine_warm_up_s": time.perf_counter() - t,
               "engine_warm_up_compiles": len(compiles.events) if not args.no_engine_warm_up else 0}
        warm_up_compiles = run_trace(engine, *warm_up, args.concurrency, args.output_len)["steps_with_compiles"]
        row.update(kv_tokens=budget.kv_tokens, snapshots=budget.num_snapshots, warm_up_compiles=warm_up_compiles)
        for i, convs in enumerate(passes):  # each pass its own conversations: the same mix of hits and misses
            trace = functools.partial(run_trace, engine, *convs, args.concurrency, args.output_len)
            if args.sync_sites and i == len(passes) - 1:
                row[f"pass{i}"], row["sync_sites"] = sync_sites(trace)
            else:
                row[f"pass{i}"] = trace()
            brief = {k: v for k, v in row[f"pass{i}"].items() if k not in ("slowest_steps", "steps_with_compiles")}
            print(label, f"pass {i}", json.dumps(brief, default=str), flush=True)
        stats = engine.prefix_cache_stats()
        if stats is not None:
            row["prefix_cache"] = {k: v for k, v in vars(stats).items() if not k.startswith("_")}
        rows[label] = row
        del engine, trace  # the partial holds the engine too
        free_device_memory(torch.device(args.device))
    report = {**result_header("benchmark/multi_turn_steps.py", argv, args, torch.device(args.device)), "results": rows}
    write_json(report, args.out)
    return report


if __name__ == "__main__":
    main()
