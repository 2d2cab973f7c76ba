"""Adaptive speculation length on a grid of batch sizes and acceptance rates, from step costs measured on the device.

    python benchmark/adaptive_grid.py --model_shape qwen3.5-27b --device cuda --max_k 3 --batch_sizes 1,2,4,8,16 \
        --out benchmark/results/adaptive_grid_qwen3.5-27b_h100.json

1. A plain engine: its decode graphs' replay time per batch size (the "no MTP" step).
2. An MTP engine (eagle, k = max_k, --mtp_adaptive): the step-cost table it measures at start-up (verify graph of
   every block size + draft window + chain steps, replayed on padding rows: the forwards only, without the accept
   rule, sampling and host work).
3. For each (batch size, per-position acceptance a), the controller runs on a simulated acceptance schedule (every
   draft accepted with probability a given the ones before it) against that table; the throughput of its choices
   is compared with the best of no MTP and every fixed k = 1..max_k at the same costs.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from benchmark.model_source import add_source_args, build_engine, engine_settings, resolve_source
from benchmark.static_inference import free_device_memory
from benchmark.timing import device_info, versions
from lightllm_mtp.spec_decode.adaptive import AcceptanceEstimate, SpecLengthController, StepCostTable, expected_tokens


def simulate(costs: StepCostTable, batch: int, rates: list[float], launches: int, seed: int) -> list[int]:
    """Chosen k per launch for `batch` requests whose drafts are accepted at position j with probability rates[j]
    (given the ones before were), drawn after each choice and fed back as verify results."""
    rng, controller = random.Random(seed), SpecLengthController(costs)
    reqs = [AcceptanceEstimate() for _ in range(batch)]
    chosen = []
    for _ in range(launches):
        k = controller.choose(reqs)
        chosen.append(k)
        for r in reqs:
            accepted = 0
            while accepted < k and rng.random() < rates[accepted]:
                accepted += 1
            controller.observe(r, k, accepted)
    return chosen


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_args(p, shape_required=True)
    p.add_argument("--max_k", type=int, default=3)
    p.add_argument("--batch_sizes", default="1,2,4,8,16")
    p.add_argument("--rates", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,0.95")
    p.add_argument("--launches", type=int, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    rates = [float(a) for a in args.rates.split(",")]
    ns = engine_settings(args, max(sizes), graph_max_batch_size=max(sizes), mtp_mode="eagle_with_att",
                         mtp_step=args.max_k)
    source = resolve_source(ns)
    device = torch.device(args.device)
    max_model_len = 128

    engine = build_engine(source, ns, max_model_len, mtp=False)
    decode = engine.model_runner.graphs[0]
    decode_ms = {b: decode.replay_ms(next(s for s in decode.sizes if s >= b), iters=20) for b in sizes}
    del engine, decode
    free_device_memory(device)
    print("decode ms", decode_ms, flush=True)

    ns.mtp_adaptive = True
    engine = build_engine(source, ns, max_model_len, mtp=True)
    costs: StepCostTable = engine.runner.controller.costs
    del engine
    free_device_memory(device)
    print("step costs", costs, flush=True)

    grid = []
    for b in sizes:
        row_costs = costs.row(b)
        for a in rates:
            r = [a] * args.max_k
            fixed = {k: b * expected_tokens(r, k) / row_costs[k] for k in range(1, args.max_k + 1)}
            no_mtp = b / decode_ms[b]
            best_name, best = max([("no_mtp", no_mtp)] + [(f"k={k}", v) for k, v in fixed.items()], key=lambda x: x[1])
            chosen = simulate(costs, b, r, args.launches, args.seed)[args.launches // 3 :]
            adaptive = sum(b * expected_tokens(r, k) for k in chosen) / sum(row_costs[k] for k in chosen)
            cell = {"batch_size": b, "acceptance": a, "tokens_per_ms": {"no_mtp": no_mtp, **{f"k={k}": v for k, v in
                    fixed.items()}, "adaptive": adaptive}, "best_fixed": best_name,
                    "adaptive_vs_best": adaptive / best, "chosen_k_counts": [chosen.count(k) for k in
                    range(args.max_k + 1)]}  # fmt: skip
            grid.append(cell)
            print(json.dumps(cell), flush=True)
    report = {
        "command": "python " + " ".join(sys.argv if argv is None else ["benchmark/adaptive_grid.py", *argv]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": device_info(device),
        "versions": versions(),
        "model": {"shape": args.model_shape, "weights": "random"},
        "method": __doc__.split("\n\n", 2)[2].strip(),
        "decode_graph_ms": decode_ms,
        "step_cost_table": {"batch_sizes": costs.batch_sizes, "cost_ms_by_k": costs.cost_ms,
                            "ms_per_context_token_by_k": costs.ms_per_context_token},
        "grid": grid,
        "min_adaptive_vs_best": min(c["adaptive_vs_best"] for c in grid),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    _plot(grid, sizes, rates, out.with_suffix(".png"))
    print("min adaptive / best:", report["min_adaptive_vs_best"])
    return report


def _plot(grid, sizes, rates, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", flush=True)
        return
    values = [[next(c["adaptive_vs_best"] for c in grid if c["batch_size"] == b and c["acceptance"] == a)
               for a in rates] for b in sizes]  # fmt: skip
    fig, ax = plt.subplots(figsize=(8, 3 + 0.3 * len(sizes)))
    im = ax.imshow(values, vmin=0.9, vmax=1.05, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(rates)), [str(a) for a in rates])
    ax.set_yticks(range(len(sizes)), [str(b) for b in sizes])
    ax.set_xlabel("per-position acceptance")
    ax.set_ylabel("batch size")
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
    ax.set_title("adaptive k throughput / best of {no MTP, fixed k}")
    fig.colorbar(im)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
