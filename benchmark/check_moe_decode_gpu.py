"""GPU check and timing of the MoE decode layer at the Qwen3.5-35B-A3B shape (256 experts, top-8, H 2048, I 512,
shared expert I 512, bf16, random routing): the layer's path (router+gate GEMM, route_align, the expert-major pass)
against the per-expert reference, and its time per layer inside a CUDA graph (8 layers of weights by default, so
expert reads come from HBM, not L2) at decode rows T = 1..64 and verify rows B * (k+1); sweeps the pass's tiles
(the gate_up / down tiles) and routing + alignment in one
kernel (route_align's pair bound 64) against route_topk + moe_align (bound 0).

    python benchmark/check_moe_decode_gpu.py [--layers 8] [--rows 1,2,4,7,8,16,32,64,128] [--pdl]

--pdl also times the default tiles with programmatic dependent launch off and on, and route_align on 4, 2 and 1
warps (the sweep above runs with the environment's PDL setting, on by default). The stop-27 logs measured the
"route_align 4 warps" rows at T=1 with its one-row default of 1 warp (fixed since).

Effective bandwidth = bytes of the distinct experts routed (plus the shared expert) / time per layer.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

import dataclasses

from benchmark.timing import graph_replay_ms
from lightllm_mtp import env
from lightllm_mtp.kernels.moe import moe_route_align
from lightllm_mtp.kernels.moe.fused_moe import fused_moe_shared
from lightllm_mtp.kernels.moe.moe_expert_pass import (
    DECODE_TILES,
    ExpertPassTiles,
    expert_pass_ref,
    expert_pass_triton,
)  # fmt: skip
from lightllm_mtp.kernels.moe.moe_route_align import FUSED_MAX_PAIRS, fused_fits, route_align
from lightllm_mtp.kernels.moe.moe_routing import route_topk, stack_router

EXPERTS, TOP_K, HIDDEN, INTER = 256, 8, 2048, 512
SWEEP = [
    DECODE_TILES,
    ExpertPassTiles(gate_up_block_n=16, down_block_n=32),
    ExpertPassTiles(gate_up_block_n=64, gate_up_block_k=64, down_block_n=128, down_block_k=64),
    ExpertPassTiles(gate_up_block_k=256, gate_up_stages=3, down_block_k=256, down_stages=2),
    ExpertPassTiles(num_warps=8, gate_up_block_n=64, down_block_n=128),
    ExpertPassTiles(block_m=32),
]


def make_layers(n, dev):
    layers = []
    for _ in range(n):
        layers.append(dict(
            router=stack_router(torch.randn(EXPERTS, HIDDEN, device=dev, dtype=torch.bfloat16) * 0.02,
                                torch.randn(1, HIDDEN, device=dev, dtype=torch.bfloat16) * 0.02),
            w_gu=torch.randn(EXPERTS, 2 * INTER, HIDDEN, device=dev, dtype=torch.bfloat16) * 0.03,
            w_d=torch.randn(EXPERTS, HIDDEN, INTER, device=dev, dtype=torch.bfloat16) * 0.03,
            s_gu=torch.randn(2 * INTER, HIDDEN, device=dev, dtype=torch.bfloat16) * 0.03,
            s_d=torch.randn(HIDDEN, INTER, device=dev, dtype=torch.bfloat16) * 0.03,
        ))  # fmt: skip
    return layers


def moe_layer(x, layer, tiles, fused_pairs):
    r = route_align(F.linear(x, layer["router"]), num_experts=EXPERTS, top_k=TOP_K, shared_gate=True,
                    block_m=tiles.block_m, max_fused_pairs=fused_pairs)  # fmt: skip
    return expert_pass_triton(x, layer["w_gu"], layer["w_d"], r.weights, r.ids, layer["s_gu"], layer["s_d"], tiles,
                              alignment=(r.sorted_pairs, r.block_expert))  # fmt: skip


def graph_ms_per_layer(x, layers, tiles, fused_pairs=FUSED_MAX_PAIRS, iters=10):
    # the layers in sequence on one stream, each on the same input (its own router: its own experts)
    return graph_replay_ms(lambda: [moe_layer(x, layer, tiles, fused_pairs) for layer in layers], iters) / len(layers)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=8)  # 8 x 1.6 GB of experts: far past L2
    p.add_argument("--rows", default="1,2,4,7,8,16,32,64,128")
    p.add_argument("--pdl", action="store_true")
    args = p.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    layers = make_layers(args.layers, dev)
    expert_bytes = 3 * INTER * HIDDEN * 2
    for t in (int(r) for r in args.rows.split(",")):
        x = torch.randn(t, HIDDEN, device=dev, dtype=torch.bfloat16)
        layer = layers[0]
        weights, ids = route_topk(F.linear(x, layer["router"]), num_experts=EXPERTS, top_k=TOP_K, shared_gate=True)
        out = fused_moe_shared(x, layer["w_gu"], layer["w_d"], layer["s_gu"], layer["s_d"], weights, ids)
        ref = expert_pass_ref(x, layer["w_gu"], layer["w_d"], weights, ids, layer["s_gu"], layer["s_d"])
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        assert err < 1e-2, err
        distinct = torch.unique(ids).numel()  # routed + shared
        print(f"T={t}: rel err {err:.1e}, {distinct} distinct experts (incl. shared), "
              f"{distinct * expert_bytes / 1e6:.1f} MB of expert weights per layer")  # fmt: skip
        for tiles, fused_pairs in [(t_, FUSED_MAX_PAIRS) for t_ in SWEEP] + [(DECODE_TILES, 0)]:
            r = route_align(F.linear(x, layer["router"]), num_experts=EXPERTS, top_k=TOP_K, shared_gate=True,
                            block_m=tiles.block_m, max_fused_pairs=fused_pairs)  # fmt: skip
            got = expert_pass_triton(x, layer["w_gu"], layer["w_d"], r.weights, r.ids, layer["s_gu"], layer["s_d"],
                                     tiles, alignment=(r.sorted_pairs, r.block_expert))  # fmt: skip
            rel = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
            assert rel < 1e-2, (tiles, fused_pairs, rel)  # every launch shape checked before it is timed
            ms = graph_ms_per_layer(x, layers, tiles, fused_pairs)
            kernels = (1 if fused_fits(t, TOP_K + 1, EXPERTS, fused_pairs) else 2) + 3
            print(f"  fused_pairs={fused_pairs} {tiles}: {ms * 1e3:.1f} us/layer (router GEMM + {kernels} kernels), "
                  f"{distinct * expert_bytes / ms / 1e6:.0f} GB/s", flush=True)  # fmt: skip
        if args.pdl:
            tiles = DECODE_TILES
            saved = env.ENV, moe_route_align.ROUTE_ALIGN_WARPS, moe_route_align.ONE_ROW_WARPS
            for label, pdl, warps in (("pdl off", False, 4), ("pdl on", True, 4), ("pdl on, route_align 2 warps", True,
                                      2), ("pdl on, route_align 1 warp", True, 1)):  # fmt: skip
                env.ENV = dataclasses.replace(saved[0], pdl=pdl)
                moe_route_align.ROUTE_ALIGN_WARPS = moe_route_align.ONE_ROW_WARPS = warps
                r = route_align(F.linear(x, layer["router"]), num_experts=EXPERTS, top_k=TOP_K, shared_gate=True,
                                block_m=tiles.block_m)  # fmt: skip
                got = expert_pass_triton(x, layer["w_gu"], layer["w_d"], r.weights, r.ids, layer["s_gu"],
                                         layer["s_d"], tiles, alignment=(r.sorted_pairs, r.block_expert))  # fmt: skip
                assert ((got.float() - ref.float()).norm() / ref.float().norm()).item() < 1e-2
                ms = graph_ms_per_layer(x, layers, tiles)
                print(f"  {label} {tiles}: {ms * 1e3:.1f} us/layer", flush=True)
            env.ENV, moe_route_align.ROUTE_ALIGN_WARPS, moe_route_align.ONE_ROW_WARPS = saved
    print("moe decode check OK")


if __name__ == "__main__":
    main()
