"""The tiled block-FP8 GEMM (kernels/quant/fp8_gemm.py) at decode / verify row counts, swept over its launch shapes
and its two roundings: weight-only (e4m3 weights converted exactly to bf16 on the 16-bit tensor cores, each scale
block's products scaled once) and w8a8 with the activations rounded per 1 x 128 group inside the kernel (FP8 tensor
cores). Against the bf16 engine linear on the same shape (the two results files also hold the FP8 GEMV this
kernel replaced, at <= 4 rows): time per call inside a CUDA graph over
weight copies that do not fit the L2, effective weight bandwidth, the error against the path's own reference, and
whether a row's result depends on how many rows run with it (bitwise, row 0 alone vs in the batch). `best` lists the
fastest launch shape per (shape, rows, rounding); `scaled_mm_us`: torch._scaled_mm's blockwise w8a8 (cuBLAS) with
its activation quantization launch, for comparison. Decides fp8_linear's dispatch and tiles.

    python benchmark/check_fp8_few_rows_gpu.py [--rows 1,2,4,8,16,32,64,128,256] [--roundings weight-only] [--out F]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmark.check_fp8_gemm_gpu import COPY_BYTES, MAX_REL_ERR, SHAPES
from benchmark.timing import graph_replay_ms, result_header, write_json
from lightllm_mtp.kernels.linear.gemv import linear
from lightllm_mtp.kernels.quant.fp8_block import quantize_fp8_block
from lightllm_mtp.kernels.quant.fp8_gemm import fp8_gemm_ref, fp8_gemm_tiles, fp8_gemm_triton
from lightllm_mtp.kernels.quant.fp8_scaled_mm import fp8_scaled_mm, scaled_mm_fits
from lightllm_mtp.kernels.triton_utils import next_pow2, num_sms

ROUNDINGS = {"weight-only": dict(act_fp8=False), "w8a8 in kernel": dict(act_fp8=True, quantize_in_kernel=True),
             "w8a8": dict(act_fp8=True)}
# (BLOCK_N, SPLIT_K, stages, warps). The first sweep (results/fp8_few_rows_h200.json, no split) also took BLOCK_N 128,
# stages 3 / 5 and 8 warps: 32-wide tiles, 4-5 stages, 4 warps were the best or within 5% at 1-16 rows
LAUNCH = [(bn, sk, 4, 4) for bn in (16, 32, 64) for sk in (1, 2, 4, 8)]
W8A8_LAUNCH = [(bn, sk, 4, 4) for bn in (32, 64, 128) for sk in (1, 2, 4, 8)]  # FP8 MMA: wider tiles at 64+ rows


def time_us(fn, weights) -> float:
    return graph_replay_ms(lambda: [fn(w) for w in weights], 5) * 1e3 / len(weights)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,4,16,32,64,128,256")
    p.add_argument("--roundings", default="weight-only", help=f"comma-separated, of {list(ROUNDINGS)}")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    rows, best = [], []
    for name, (n, k) in SHAPES.items():
        dense = torch.randn(n, k, device="cuda") * 0.02
        fp8 = [quantize_fp8_block(dense, (128, 128)) for _ in range(max(4, COPY_BYTES // (n * k)))]
        bf16 = [dense.bfloat16() for _ in range(max(4, COPY_BYTES // (2 * n * k)))]
        for t in (int(r) for r in args.rows.split(",")):
            x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
            base = dict(shape=name, n=n, k=k, t=t, bf16_us=time_us(lambda w: linear(x, w), bf16))
            if scaled_mm_fits(x, fp8[0]):  # cuBLAS blockwise w8a8, activation quantization launch included
                base["scaled_mm_us"] = time_us(lambda w: fp8_scaled_mm(x, weight=w), fp8)
            for rounding in args.roundings.split(","):
                kw = ROUNDINGS[rounding]
                want = fp8_gemm_ref(x, fp8[0], act_fp8=kw["act_fp8"]).float()
                default = fp8_gemm_tiles(t, n, k, 128, num_sms(x.device), act_fp8=kw["act_fp8"])
                block_m = max(16, min(64, next_pow2(t)))
                results = []
                for block_n, split, stages, warps in (W8A8_LAUNCH if kw["act_fp8"] else LAUNCH):
                    launch = dict(block_m=block_m, block_n=block_n, split_k=split, num_stages=stages, num_warps=warps)
                    row = dict(base, rounding=rounding, **launch, default=launch == default)
                    launch.update(kw)
                    try:
                        got = fp8_gemm_triton(x, weight=fp8[0], **launch)
                        row["rel_err"] = ((got.float() - want).norm() / want.norm()).item()
                        alone = fp8_gemm_triton(x[:1], weight=fp8[0], **launch)
                        row["row_independent"] = bool(torch.equal(alone[0], got[0]))
                        if row["rel_err"] > MAX_REL_ERR:
                            row["note"] = "result off: not timed"
                        else:
                            row["us"] = time_us(lambda w: fp8_gemm_triton(x, weight=w, **launch), fp8)
                            row["weight_GB_per_s"] = n * k / row["us"] / 1e3
                            results.append(row)
                    except Exception as e:  # noqa: BLE001  (a launch shape that does not compile)
                        row["note"] = f"{type(e).__name__}: {str(e)[:160]}"
                    rows.append(row)
                if results:
                    dflt = [r["us"] for r in results if r["default"]]
                    best.append(dict(min(results, key=lambda r: r["us"]), default_us=dflt[0] if dflt else None))
                    print({k_: (round(v, 3) if isinstance(v, float) else v) for k_, v in best[-1].items()}, flush=True)
        del dense, fp8, bf16
        torch.cuda.empty_cache()
    header = result_header("benchmark/check_fp8_few_rows_gpu.py", None, args, torch.device("cuda"))
    write_json(dict(header, best=best, rows=rows), args.out)


if __name__ == "__main__":
    main()
