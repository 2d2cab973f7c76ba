"""The few-row GEMV (kernels/linear/gemv.py) against cuBLAS (F.linear) at the projection shapes of the 35B-A3B and
27B models, T = 1, 2, 4 rows: time per call inside a CUDA graph over enough weight copies that every read comes from
HBM, and the effective bandwidth (weight bytes / time). Says which projections the GEMV should serve.

    python benchmark/check_gemv_gpu.py [--out results.json] [--sweep]

--sweep: at T=1, the GEMV's launch shapes (BLOCK_N, BLOCK_K, warps) per projection, best first (the recorded
sweeps also varied num_stages 2-4: no effect, the loop is not pipelined);
--sweep_rows 2,4: a smaller grid of them at those row counts.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from benchmark.timing import graph_replay_ms, result_header, write_json
from lightllm_mtp.kernels.linear.gemv import gemv_ref, gemv_tiles, gemv_triton
from lightllm_mtp.kernels.triton_utils import num_sms

SHAPES = {  # name: (N, K)
    "35b router + shared gate": (264, 2048),
    "35b GDN out_proj / attn o_proj": (2048, 4096),
    "35b GDN in_proj": (12352, 2048),
    "35b attn qkv": (9216, 2048),
    "27b GDN / attn out": (5120, 6144),
    "27b GDN in_proj": (16480, 5120),
    "27b MLP down": (5120, 17408),
    "27b MLP gate_up": (34816, 5120),
    "35b lm_head": (248320, 2048),
}
COPY_BYTES = 512 << 20  # weight copies per shape: >= 512 MB, ten times the L2
SWEEP_SHAPES = ("35b GDN out_proj / attn o_proj", "35b GDN in_proj", "35b attn qkv", "27b GDN / attn out",
                "27b GDN in_proj", "27b MLP down", "27b MLP gate_up", "35b lm_head")
SWEEP = [(n, k, w) for n in (1, 2, 4) for k in (1024, 2048, 4096) for w in (2, 4, 8)]
SWEEP_FEW_ROWS = [(n, k, w) for n in (1, 2, 4) for k in (512, 1024, 2048) for w in (4, 8)]


def graph_us(fn, x, weights, iters=20):
    """Microseconds per call of fn(x, w) over the weight copies, in one CUDA graph."""
    return graph_replay_ms(lambda: [fn(x, w) for w in weights], iters) * 1e3 / len(weights)


def sweep(x, weights, nbytes, shapes):
    """Every launch shape of `shapes` at this shape (checked against the reference first), fastest first."""
    out = []
    t_pad = 1 << max(x.shape[0] - 1, 0).bit_length()
    for block_n, block_k, warps in shapes:
        def fn(x_, w_):
            return gemv_triton(x_, w_, tiles=(t_pad, block_n, block_k), num_warps=warps)

        got, want = fn(x, weights[0]), gemv_ref(x, weights[0])
        assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2
        us = graph_us(fn, x, weights)
        out.append(dict(block_n=block_n, block_k=block_k, num_warps=warps, us=us, GB_per_s=nbytes / us / 1e3))
    return sorted(out, key=lambda r: r["us"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,2,4")
    p.add_argument("--out", default=None)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--sweep_rows", default="")
    args = p.parse_args()
    torch.manual_seed(0)
    sms = num_sms(torch.device("cuda"))
    rows = []
    for name, (n, k) in SHAPES.items():
        nbytes = n * k * 2
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
                   for _ in range(max(4, COPY_BYTES // nbytes))]  # fmt: skip
        for t in (int(r) for r in args.rows.split(",")):
            x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
            got, want = gemv_triton(x, weights[0]), gemv_ref(x, weights[0])
            err = ((got.float() - want.float()).norm() / want.float().norm()).item()
            assert err < 1e-2, (name, t, err)
            cublas, ours = graph_us(F.linear, x, weights), graph_us(gemv_triton, x, weights)
            row = dict(shape=name, n=n, k=k, t=t, tiles=gemv_tiles(t, n, k, sms), cublas_us=cublas, gemv_us=ours,
                       cublas_GB_per_s=nbytes / cublas / 1e3, gemv_GB_per_s=nbytes / ours / 1e3,
                       rel_err=err)  # fmt: skip
            rows.append(row)
            print(f"{name:32s} T={t} cuBLAS {cublas:7.2f} us ({row['cublas_GB_per_s']:5.0f} GB/s)  gemv "
                  f"{ours:7.2f} us ({row['gemv_GB_per_s']:5.0f} GB/s) tiles {row['tiles']}", flush=True)  # fmt: skip
            few = t in [int(r) for r in args.sweep_rows.split(",") if r]
            if ((args.sweep and t == 1) or few) and name in SWEEP_SHAPES:
                row["sweep"] = sweep(x, weights, nbytes, SWEEP_FEW_ROWS if few else SWEEP)
                for r in row["sweep"][:4]:
                    print(f"    {r}", flush=True)
        del weights
        torch.cuda.empty_cache()
    header = result_header("benchmark/check_gemv_gpu.py", None, args, torch.device("cuda"))
    write_json(dict(header, rows=rows), args.out)


if __name__ == "__main__":
    main()
