"""The latency side of a B=1 decode step's floor: what a kernel that depends on the one before it costs at the least,
and how the one-row GEMV's time grows with the bytes it reads.

Chains of dependent kernels in one CUDA graph (each reads what the one before wrote), time per kernel:
1. the project's rmsnorm on one row of 2048 (one program): the smallest kernels of a B=1 step;
2. the project's one-row GEMV (`linear`) on square weights of 0.5-50 MB, each call its own weight (no L2 reuse);
   a least-squares fit time = latency + bytes / bandwidth over the sizes.
Both with programmatic dependent launch on and off. With those two numbers, a step of K dependent kernels that
must read B bytes cannot take less than about K x latency + B / bandwidth.

    python benchmark/check_dependent_kernels_gpu.py [--chain 128] [--out results.json]
"""

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmark.timing import graph_replay_ms, measure_copy_bandwidth, versions
from lightllm_mtp import env
from lightllm_mtp.kernels.linear.gemv import linear
from lightllm_mtp.kernels.norm.rmsnorm import rmsnorm

GEMV_SIDES = (512, 1024, 2048, 3072, 4096, 5120)


def rmsnorm_chain_us(chain: int, dev) -> float:
    x = torch.randn(1, 2048, device=dev, dtype=torch.bfloat16)
    w = torch.randn(2048, device=dev, dtype=torch.bfloat16) * 0.1

    def run():
        y = x
        for _ in range(chain):
            y = rmsnorm(y, w, 1e-6)
        return y

    return graph_replay_ms(run, 20) * 1e3 / chain


def gemv_chain_us(side: int, chain: int, dev) -> float:
    weights = [torch.randn(side, side, device=dev, dtype=torch.bfloat16) * side**-0.5 for _ in range(chain)]
    x = torch.randn(1, side, device=dev, dtype=torch.bfloat16)

    def run():
        y = x
        for w in weights:
            y = linear(y, w)
        return y

    us = graph_replay_ms(run, 10) * 1e3 / chain
    del weights
    torch.cuda.empty_cache()
    return us


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares us = a + b * MB -> (a in us, 1 / b in TB/s: one MB per us is one TB/s)."""
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    b = sum((p[0] - mx) * (p[1] - my) for p in points) / sum((p[0] - mx) ** 2 for p in points)
    return my - b * mx, 1 / b


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--chain", type=int, default=128)
    p.add_argument("--out")
    args = p.parse_args()
    dev = torch.device("cuda")
    saved = env.ENV
    result = {"command": "python " + " ".join(shlex.quote(a) for a in sys.argv), "device": torch.cuda.get_device_name(),
              "versions": versions(), "copy_bandwidth": measure_copy_bandwidth(dev, 10), "chain": args.chain}
    for pdl in (True, False):
        env.ENV = dataclasses.replace(saved, pdl=pdl)
        label = "pdl_on" if pdl else "pdl_off"
        small = rmsnorm_chain_us(args.chain, dev)
        print(f"{label}: rmsnorm of one row, chained: {small:.2f} us per kernel", flush=True)
        points = []
        for side in GEMV_SIDES:
            mb = side * side * 2 / 1e6
            us = gemv_chain_us(side, max(args.chain, int(256 / mb)), dev)  # >= 256 MB a chain: past the L2
            points.append((mb, us))
            print(f"{label}: GEMV [{side} x {side}] ({mb:.1f} MB): {us:.2f} us ({mb / us:.2f} TB/s)", flush=True)
        latency, bandwidth = fit(points)
        print(f"{label}: GEMV fit: {latency:.2f} us + MB / {bandwidth:.2f} TB/s", flush=True)
        result[label] = {"rmsnorm_one_row_us": small, "gemv_points_mb_us": points, "gemv_latency_us": latency,
                         "gemv_bandwidth_tb_s": bandwidth}  # fmt: skip
    env.ENV = saved
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
