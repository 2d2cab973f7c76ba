"""The split-K attention kernel (kernels/attention/decode_attention.py) at long context for a decode row and MTP
verify blocks of 2-4 rows (k = 1..3) at the 27B shape (24 query heads over 4 KV heads of 256, bf16 KV), one request:
stage-1 launch shapes (BLOCK_N, warps, query heads split over 1 or 2 programs per KV head; the keys-major stage 1
(kernels/attention/verify_attention_keys_major.py) at BLOCK_N 32-128, 4 / 8 warps, 1 / 2 pipeline stages) against the
default, time per call in a CUDA graph and the KV bytes it streams per second; max_diff_vs_default compares each
output with the default launch's. Adaptive k's start-up table showed the per-context-token cost doubling from k=1 to
k=2 (the q tile grows from 16 to 32 rows: rows x 6 query heads per KV head).

    python benchmark/check_verify_attention_gpu.py [--lengths 262144,1048576] [--rows 1,2,3,4] [--out F]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmark.timing import graph_replay_ms, result_header, write_json
from lightllm_mtp.kernels.attention.decode_attention import splitk_attention_triton

HQ, HKV, D = 24, 4, 256
# (BLOCK_N, warps, head_split, keys_major, num_stages); None: the wrapper's default. The first is the default launch.
LAUNCH = (
    [(None, None, 1, False, 2)]
    + [(bn, w, hs, False, 2) for hs in (1, 2) for bn in (16, 32, 64) for w in (4, 8)]
    + [(None, None, 1, True, 2)]
    + [(bn, w, 1, True, st) for bn in (32, 64, 128) for w in (4, 8) for st in (1, 2)]
)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", default="262144,1048576")
    p.add_argument("--rows", default="1,2,3,4")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        k_buf = torch.randn(length, HKV, D, device="cuda", dtype=torch.bfloat16)
        v_buf = torch.randn(length, HKV, D, device="cuda", dtype=torch.bfloat16)
        req_to_token = torch.randperm(length, device="cuda", dtype=torch.int32)[None]
        b_req_idx = torch.zeros(1, dtype=torch.int32, device="cuda")
        b_seq_len = torch.full((1,), length, dtype=torch.int32, device="cuda")
        kv_bytes = 2 * length * HKV * D * 2
        for q_rows in (int(r) for r in args.rows.split(",")):
            q = torch.randn(q_rows, HQ, D, device="cuda", dtype=torch.bfloat16)
            cu = torch.tensor([0, q_rows], dtype=torch.int32, device="cuda")
            base = None
            for block_n, warps, head_split, keys_major, stages in LAUNCH:
                kw = dict(b1_cu_q_len=cu, max_q_len=q_rows, max_kv_len=length, block_n=block_n, num_warps=warps,
                          head_split=head_split, keys_major=keys_major, num_stages=stages)  # fmt: skip
                row = dict(length=length, q_rows=q_rows, block_n=block_n or "default", warps=warps or "default",
                           head_split=head_split, keys_major=keys_major, num_stages=stages)  # fmt: skip
                try:
                    out = splitk_attention_triton(q, k_buf, v_buf, req_to_token, b_req_idx, b_seq_len, D**-0.5, **kw)
                    if base is None:
                        base = out.float()
                    row["max_diff_vs_default"] = (out.float() - base).abs().max().item()
                    call = lambda: splitk_attention_triton(q, k_buf, v_buf, req_to_token, b_req_idx, b_seq_len,  # noqa: E731
                                                           D**-0.5, **kw)  # fmt: skip
                    us = graph_replay_ms(call, 10) * 1e3
                    row.update(us=us, kv_GB_per_s=kv_bytes / us / 1e3)
                except Exception as e:  # noqa: BLE001  (a launch shape that does not compile / fit)
                    row["note"] = f"{type(e).__name__}: {str(e)[:160]}"
                rows.append(row)
                print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        torch.cuda.empty_cache()
    header = result_header("benchmark/check_verify_attention_gpu.py", None, args, torch.device("cuda"))
    write_json(dict(header, rows=rows), args.out)


if __name__ == "__main__":
    main()
