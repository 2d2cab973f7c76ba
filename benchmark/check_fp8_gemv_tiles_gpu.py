"""The FP8 GEMV's launch shapes (kernels/quant/fp8_gemv.py) swept at the 27B / 35B-A3B projection shapes for 1 and 2
rows: weight rows per program (BLOCK_N), K step (BLOCK_K, a multiple of the 128-wide scale block), warps, stages;
time per call inside a CUDA graph over weight copies that do not fit the L2, against the bf16 engine linear on the
same shape. Each row of the output is one launch shape; `best` lists the fastest per (shape, rows). Decides
fp8_gemv_tiles.

    python benchmark/check_fp8_gemv_tiles_gpu.py [--rows 1,2,4] [--out results.json]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmark.check_fp8_gemm_gpu import COPY_BYTES, SHAPES
from benchmark.timing import graph_replay_ms, result_header, write_json
from lightllm_mtp.kernels.linear.gemv import linear
from lightllm_mtp.kernels.quant.fp8_block import quantize_fp8_block
from lightllm_mtp.kernels.quant.fp8_gemv import fp8_gemv_ref, fp8_gemv_tiles, fp8_gemv_triton
from lightllm_mtp.kernels.triton_utils import next_pow2, num_sms

# (BLOCK_N, BLOCK_K, warps, stages): several scale blocks per K step (rescaled in registers), or one (its scale
# multiplies the partial sums) with more weight rows per program and a pipelined loop
SHAPES_MANY_BLOCKS = [(bn, bk, w, 1) for bn in (1, 2, 4) for bk in (512, 1024, 2048) for w in (4, 8)]
SHAPES_ONE_BLOCK = []  # BLOCK_K = 128, BLOCK_N 8..64, stages 1-4: measured 2x slower (results/fp8_gemv_tiles_h200.json)
MAX_PRODUCTS = 32768  # T_PAD x BLOCK_N x BLOCK_K per step: more spills registers


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,2")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    rows, best = [], []
    sms = num_sms(torch.device("cuda"))
    for name, (n, k) in SHAPES.items():
        dense = torch.randn(n, k, device="cuda") * 0.02
        fp8 = [quantize_fp8_block(dense, (128, 128)) for _ in range(max(4, COPY_BYTES // (n * k)))]
        bf16 = [dense.bfloat16() for _ in range(max(4, COPY_BYTES // (2 * n * k)))]
        for t in (int(r) for r in args.rows.split(",")):
            x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
            want = fp8_gemv_ref(x, fp8[0]).float()
            us_bf16 = graph_replay_ms(lambda: [linear(x, w) for w in bf16], 10) * 1e3 / len(bf16)
            default = fp8_gemv_tiles(t, n, k, 128, sms)
            results = []
            for block_n, block_k, warps, stages in SHAPES_MANY_BLOCKS + SHAPES_ONE_BLOCK:
                tiles = (next_pow2(t), block_n, min(block_k, max(128, next_pow2(k))))
                if tiles[0] * block_n * tiles[2] > MAX_PRODUCTS:
                    continue
                row = dict(shape=name, n=n, k=k, t=t, block_n=block_n, block_k=tiles[2], warps=warps, stages=stages)
                kw = dict(tiles=tiles, num_warps=warps)
                try:
                    got = fp8_gemv_triton(x, weight=fp8[0], **kw).float()
                    row["rel_err"] = ((got - want).norm() / want.norm()).item()
                    if row["rel_err"] > 1e-2:
                        row["note"] = "result off: not timed"
                    else:
                        fn = lambda: [fp8_gemv_triton(x, weight=w, **kw) for w in fp8]  # noqa: E731
                        us = graph_replay_ms(fn, 5) * 1e3 / len(fp8)
                        row.update(us=us, weight_GB_per_s=n * k / us / 1e3, bf16_us=us_bf16,
                                   default=tiles == default and warps == 4 and stages == 1)  # fmt: skip
                        results.append(row)
                except Exception as e:  # noqa: BLE001  (a launch shape that does not compile)
                    row["note"] = f"{type(e).__name__}: {str(e)[:160]}"
                rows.append(row)
            if results:
                top = min(results, key=lambda r: r["us"])
                dflt = [r for r in results if r["default"]]
                best.append(dict(top, default_us=dflt[0]["us"] if dflt else None))
                print({k_: (round(v, 3) if isinstance(v, float) else v) for k_, v in best[-1].items()}, flush=True)
        del dense, fp8, bf16
        torch.cuda.empty_cache()
    header = result_header("benchmark/check_fp8_gemv_tiles_gpu.py", None, args, torch.device("cuda"))
    write_json(dict(header, best=best, rows=rows), args.out)


if __name__ == "__main__":
    main()
