"""Block-FP8 projections (kernels/quant/) against bf16 at the 27B / 35B-A3B projection shapes, per row count T:
bf16 (`kernels.linear.gemv.linear`: the GEMV or cuBLAS), the FP8 tiled GEMM weight-only and w8a8 (the FP8 GEMV of
stop 38 is gone: results/fp8_few_rows_h200.json), the dispatcher `fp8_linear`, and torch._scaled_mm's blockwise mode (1x128 activations x 128x128 weights) where
this torch has it: time per call inside a CUDA graph over enough weight copies that every read comes from HBM,
effective weight bandwidth, and each result's error against the fp32 reference (a path whose error is off is
reported, not timed). Decided where _scaled_mm takes over in kernels/quant/fp8_linear.py (SCALED_MM_MIN_ROWS,
SCALED_MM_MIN_OUT; stop 39 also the weight-only / w8a8 split, which stop 40 replaced by w8a8 everywhere).

    python benchmark/check_fp8_gemm_gpu.py [--rows 1,2,4,16,64,256,1024,4096,16384] [--out results.json]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmark.timing import graph_replay_ms, result_header, write_json
from lightllm_mtp.kernels.linear.gemv import linear
from lightllm_mtp.kernels.quant.fp8_block import quantize_fp8_block
from lightllm_mtp.kernels.quant.fp8_gemm import fp8_gemm_ref, fp8_gemm_triton, quantize_activations_fp8
from lightllm_mtp.kernels.quant.fp8_linear import fp8_linear

SHAPES = {  # name: (N, K)
    "27b GDN in_proj qkv+z": (16384, 5120),
    "27b MLP gate_up": (34816, 5120),
    "27b MLP down": (5120, 17408),
    "27b attn / GDN out": (5120, 6144),
    "35b GDN in_proj qkv+z": (12288, 2048),
    "35b attn / GDN out": (2048, 4096),
}
COPY_BYTES = 512 << 20  # FP8 weight copies per shape: >= 512 MB, ten times the L2
MAX_REL_ERR = 2e-2  # against the reference of the path's own rounding (the weight-only one, or w8a8's)
ACTIVATION_FP8 = ("fp8 GEMM w8a8", "torch._scaled_mm blockwise")


def scaled_mm_blockwise(x, w):
    """torch._scaled_mm with 1 x 128 activation scales and 128 x 128 weight scales, in the layouts pytorch's
    test_scaled_mm_block_wise_numerics uses (activation scales column-major [M, K/128]; weight scales [N/128, K/128]
    with K/128 padded to a multiple of 4, passed transposed). None when this torch refuses it."""
    q, s = quantize_activations_fp8(x, group=128)
    k_blocks = w.scale.shape[1]
    l4 = -(-k_blocks // 4) * 4
    w_scale = torch.zeros(w.scale.shape[0], l4, device=x.device)
    w_scale[:, :k_blocks] = w.scale
    return torch._scaled_mm(q, w.qweight.t(), scale_a=s.t().contiguous().t(), scale_b=w_scale.t(),
                            out_dtype=torch.bfloat16)  # fmt: skip


def paths(t: int) -> dict:
    out = {
        "fp8_linear (dispatch)": lambda x, w, d: fp8_linear(x, w),
        "fp8 GEMM weight-only": lambda x, w, d: fp8_gemm_triton(x, weight=w, act_fp8=False),
        "fp8 GEMM w8a8": lambda x, w, d: fp8_gemm_triton(x, weight=w, act_fp8=True),
        "bf16 (engine linear)": lambda x, w, d: linear(x, d),
    }
    if hasattr(torch, "_scaled_mm") and t >= 16:
        out["torch._scaled_mm blockwise"] = lambda x, w, d: scaled_mm_blockwise(x, w)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,2,4,16,64,256,1024,4096,16384")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for name, (n, k) in SHAPES.items():
        copies = max(4, COPY_BYTES // (n * k))
        dense = [torch.randn(n, k, device="cuda") * 0.02 for _ in range(2)]
        fp8 = [quantize_fp8_block(dense[i % 2], (128, 128)) for i in range(copies)]
        bf16 = [dense[i % 2].bfloat16() for i in range(max(4, COPY_BYTES // (2 * n * k)))]
        for t in (int(r) for r in args.rows.split(",")):
            x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
            want = fp8_gemm_ref(x, fp8[0], act_fp8=False).float()
            want_w8a8 = fp8_gemm_ref(x, fp8[0], act_fp8=True).float()  # activations rounded to e4m3 per 1 x 128
            for label, fn in paths(t).items():
                row = dict(shape=name, n=n, k=k, t=t, path=label)
                try:
                    got = fn(x, fp8[0], bf16[0]).float()
                    w8a8 = label in ACTIVATION_FP8 or label.startswith("fp8_linear")  # w8a8 at every row count on CUDA
                    ref = want_w8a8 if w8a8 else want
                    row["reference"] = "w8a8" if w8a8 else "weight-only"
                    row["rel_err"] = ((got - ref).norm() / ref.norm()).item()
                    if row["rel_err"] > MAX_REL_ERR and not label.startswith("bf16"):
                        row["note"] = "result off: not timed"
                    else:
                        weights = bf16 if label.startswith("bf16") else fp8
                        us = graph_replay_ms(lambda: [fn(x, w, w) for w in weights], 10) * 1e3 / len(weights)
                        wbytes = n * k * (2 if label.startswith("bf16") else 1)
                        row.update(us=us, weight_GB_per_s=wbytes / us / 1e3,
                                   tflops=2 * t * n * k / us / 1e6)  # fmt: skip
                except Exception as e:  # noqa: BLE001  (a path this torch / GPU lacks)
                    row["note"] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.append(row)
                print({k_: (round(v, 3) if isinstance(v, float) else v) for k_, v in row.items()}, flush=True)
        del dense, fp8, bf16
        torch.cuda.empty_cache()
    header = result_header("benchmark/check_fp8_gemm_gpu.py", None, args, torch.device("cuda"))
    write_json(dict(header, rows=rows), args.out)


if __name__ == "__main__":
    main()
