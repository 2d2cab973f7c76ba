"""GPU check and timing of the prefill MoE path (fused_moe_grouped) at the Qwen3.5-35B-A3B shape (256 experts,
top-8, H 2048, I 512, bf16, softmax top-k routing of random logits) at T = 4096 and 16384 tokens: the current path
(sort_by_expert + moe_permute + two grouped GEMMs + moe_unpermute) against the previous one (argsort, scatter_add_
counts, x[token] gather, fp32 weighted index_add_; kept below as `previous_grouped`) and the per-expert reference,
then the time of each and of their pieces (CUDA events, median of --iters), and a sweep of the permute / unpermute
kernels' launch tiles (GB/s = bytes read + written / time).

    python benchmark/check_moe_prefill_gpu.py [--tokens 4096,16384] [--iters 20] [--out results.json]

GEMM TFLOP/s = 2 * T * k * 3 * I * H / the time of the two grouped GEMMs alone; "share" = that GEMM time / the
whole path's time (the prefill floor counts the GEMM FLOPs only).
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from lightllm_mtp.kernels.activation.silu_and_mul import silu_and_mul
from lightllm_mtp.kernels.moe.fused_moe import fused_moe_grouped, fused_moe_ref
from lightllm_mtp.kernels.moe.moe_permute import (
    CopyTile,
    moe_permute,
    moe_permute_triton,
    moe_unpermute,
    moe_unpermute_triton,
    sort_by_expert,
)  # fmt: skip
from lightllm_mtp.kernels.moe.moe_routing import select_experts

EXPERTS, TOP_K, HIDDEN, INTER = 256, 8, 2048, 512
# launch shapes of the permute / unpermute kernels timed beside the default (the first)
TILES = [CopyTile(4, 1024, 4), CopyTile(2, 1024, 4), CopyTile(8, 512, 4), CopyTile(1, 2048, 8), CopyTile(8, 1024, 8),
         CopyTile(16, 256, 4)]  # fmt: skip


def previous_grouped(x, w_gate_up, w_down, topk_weights, topk_ids):
    """fused_moe_grouped before moe_permute / moe_unpermute (the baseline of this check)."""
    t, top_k = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    token = order // top_k
    counts = torch.zeros(w_gate_up.shape[0], dtype=torch.int64, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    offs = counts.cumsum(0).to(torch.int32)
    gate_up = torch._grouped_mm(x[token], w_gate_up.transpose(1, 2), offs=offs)
    down = torch._grouped_mm(silu_and_mul(gate_up), w_down.transpose(1, 2), offs=offs)
    weighted = down.float() * topk_weights.reshape(-1)[order].float()[:, None]
    out = torch.zeros(t, x.shape[1], dtype=torch.float32, device=x.device).index_add_(0, token, weighted)
    return out.to(x.dtype)


def time_ms(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", default="4096,16384")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default="")
    args = p.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    w_gu = torch.randn(EXPERTS, 2 * INTER, HIDDEN, device=dev, dtype=torch.bfloat16) * 0.03
    w_d = torch.randn(EXPERTS, HIDDEN, INTER, device=dev, dtype=torch.bfloat16) * 0.03
    results = []
    for t in (int(s) for s in args.tokens.split(",")):
        x = torch.randn(t, HIDDEN, device=dev, dtype=torch.bfloat16)
        weights, ids = select_experts(torch.randn(t, EXPERTS, device=dev, dtype=torch.bfloat16), TOP_K)
        out = fused_moe_grouped(x, w_gu, w_d, weights, ids)
        assert torch.equal(out, fused_moe_grouped(x, w_gu, w_d, weights, ids)), "not deterministic"
        prev = previous_grouped(x, w_gu, w_d, weights, ids)
        err_prev = rel_err(out, prev)
        ref = fused_moe_ref(x[:512].float(), w_gu.float(), w_d.float(), weights[:512], ids[:512])
        err_ref = rel_err(out[:512], ref)  # the first 512 tokens (routed in the full batch) vs fp32 per expert
        assert err_prev < 1e-2 and err_ref < 1e-2, (err_prev, err_ref)

        order, ends = sort_by_expert(ids, num_experts=EXPERTS)
        rows, pos = moe_permute(x, order, top_k=TOP_K)
        gate_up = torch._grouped_mm(rows, w_gu.transpose(1, 2), offs=ends)
        act = silu_and_mul(gate_up)
        down = torch._grouped_mm(act, w_d.transpose(1, 2), offs=ends)
        it = args.iters
        pieces = {
            "sort_by_expert": time_ms(lambda: sort_by_expert(ids, num_experts=EXPERTS), it),
            "moe_permute": time_ms(lambda: moe_permute(x, order, top_k=TOP_K), it),
            "grouped_gemm_gate_up": time_ms(lambda: torch._grouped_mm(rows, w_gu.transpose(1, 2), offs=ends), it),
            "silu_and_mul": time_ms(lambda: silu_and_mul(gate_up), it),
            "grouped_gemm_down": time_ms(lambda: torch._grouped_mm(act, w_d.transpose(1, 2), offs=ends), it),
            "moe_unpermute": time_ms(lambda: moe_unpermute(down, pos, weights), it),
        }
        ms_prev = time_ms(lambda: previous_grouped(x, w_gu, w_d, weights, ids), it)
        ms_now = time_ms(lambda: fused_moe_grouped(x, w_gu, w_d, weights, ids), it)
        gemm_ms = pieces["grouped_gemm_gate_up"] + pieces["grouped_gemm_down"]
        flops = 2 * t * TOP_K * 3 * INTER * HIDDEN
        row = dict(tokens=t, previous_ms=ms_prev, current_ms=ms_now, speedup=ms_prev / ms_now, pieces_ms=pieces,
                   gemm_tflops=flops / gemm_ms / 1e9, gemm_share_previous=gemm_ms / ms_prev,
                   gemm_share_current=gemm_ms / ms_now, rel_err_vs_previous=err_prev, rel_err_vs_reference=err_ref)
        results.append(row)
        print(f"T={t}: previous {ms_prev:.3f} ms, current {ms_now:.3f} ms ({ms_prev / ms_now:.2f}x); rel err "
              f"{err_prev:.1e} vs previous, {err_ref:.1e} vs reference; GEMMs {gemm_ms:.3f} ms "
              f"({flops / gemm_ms / 1e9:.0f} TFLOP/s), {gemm_ms / ms_now:.0%} of the current path")  # fmt: skip
        print("  " + ", ".join(f"{k} {v:.3f} ms" for k, v in pieces.items()))
        permute_bytes = 2 * t * TOP_K * HIDDEN * x.element_size()  # rows read (x's, k times) + written
        unpermute_bytes = (TOP_K + 1) * t * HIDDEN * x.element_size()  # down read, out written
        tiles = {}
        for tile in TILES:
            r2, p2 = moe_permute_triton(x, order, top_k=TOP_K, tile=tile)
            assert torch.equal(r2, rows) and torch.equal(p2, pos), tile
            got = moe_unpermute_triton(down, pos, weights, tile=tile)
            torch.testing.assert_close(got, out, rtol=1e-3, atol=1e-3)  # the same sum order; bits may differ by FMA
            ms_p = time_ms(lambda: moe_permute_triton(x, order, top_k=TOP_K, tile=tile), it)
            ms_u = time_ms(lambda: moe_unpermute_triton(down, pos, weights, tile=tile), it)
            tiles[str(tuple(tile))] = dict(permute_ms=ms_p, unpermute_ms=ms_u)
            print(f"  tile {tuple(tile)}: permute {ms_p:.3f} ms ({permute_bytes / ms_p / 1e6:.0f} GB/s), unpermute "
                  f"{ms_u:.3f} ms ({unpermute_bytes / ms_u / 1e6:.0f} GB/s)")  # fmt: skip
        row["tiles"] = tiles
        del rows, gate_up, act, down
    if args.out:
        meta = dict(command=" ".join(sys.argv), device=torch.cuda.get_device_name(), torch=torch.__version__,
                    shape=dict(experts=EXPERTS, top_k=TOP_K, hidden=HIDDEN, inter=INTER, dtype="bfloat16"))
        Path(args.out).write_text(json.dumps(dict(meta=meta, results=results), indent=2))
    print("moe prefill check OK")


if __name__ == "__main__":
    main()
