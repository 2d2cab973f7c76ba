"""Two of the 35B-A3B B=1 decode step's small kernels, timed inside a CUDA graph (H100): the GDN decode recurrence
(B=1, 32 value heads of 128 x 128 fp32 state, one state slot per call so reads come from HBM) over its V tile, and
the split-K decode attention (B=1, 16 q / 2 KV heads of 256, 1k tokens) over its split count, at two max_kv_len
(the grid's bound: the engine passes max_model_len).

    python benchmark/check_decode_small_kernels_gpu.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmark.timing import graph_replay_ms
from lightllm_mtp.kernels.attention.decode_attention import decode_attention_ref, splitk_attention_triton
from lightllm_mtp.kernels.gdn.gated_delta_rule import gated_delta_rule_decode_ref, gated_delta_rule_decode_triton

SLOTS = 40  # 40 x 2 MB of state: past the L2


def gdn_decode():
    torch.manual_seed(0)
    nk, nv, d = 16, 32, 128
    q, k = (torch.randn(1, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(1, nv, d, device="cuda", dtype=torch.bfloat16)
    g = -torch.rand(1, nv, device="cuda")
    beta = torch.rand(1, nv, device="cuda")
    state = torch.randn(SLOTS, nv, d, d, device="cuda") * 0.1
    idx = [torch.tensor([s], device="cuda", dtype=torch.int32) for s in range(SLOTS)]
    first = state[:1].clone()  # slot 0 as it was: each timed graph updates the states in place
    want = gated_delta_rule_decode_ref(q, k, v, g, beta, first.clone(), idx[0])
    for block_v in (None, 8, 16, 32, 64, 128):
        s0 = first.clone()
        got = gated_delta_rule_decode_triton(q, k, v, g, beta, s0, idx[0], block_v=block_v)
        if not torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2):
            print(f"GDN decode block_v={block_v}: WRONG (max err {(got.float() - want.float()).abs().max():.3g})")
            continue
        ms = graph_replay_ms(lambda: [gated_delta_rule_decode_triton(q, k, v, g, beta, state, i, block_v=block_v)
                                      for i in idx], 10) / SLOTS  # fmt: skip
        print(f"GDN decode B=1 block_v={block_v}: {ms * 1e3:.2f} us per call ({4 * nv * d * d * 2 / ms / 1e6:.0f} GB/s"
              f" of state read + written)", flush=True)  # fmt: skip


def attention():
    torch.manual_seed(0)
    hq, hkv, d, seq = 16, 2, 256, 1024
    copies = 16
    for max_len in (1088, 8192):
        q = torch.randn(1, hq, d, device="cuda", dtype=torch.bfloat16)
        ks = [torch.randn(max_len, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        vs = [torch.randn(max_len, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        req_to_token = torch.arange(max_len, device="cuda", dtype=torch.int32)[None]
        b_req_idx = torch.zeros(1, device="cuda", dtype=torch.int32)
        b_seq_len = torch.tensor([seq], device="cuda", dtype=torch.int32)
        want = decode_attention_ref(q, ks[0], vs[0], req_to_token, b_req_idx, b_seq_len, d**-0.5)
        for splits in (None, 4, 8, 16, 32, 64):
            def run(i, splits=splits):
                return splitk_attention_triton(q, ks[i], vs[i], req_to_token, b_req_idx, b_seq_len, d**-0.5,
                                               num_splits=splits)  # fmt: skip
            if not torch.allclose(run(0).float(), want.float(), atol=2e-2, rtol=2e-2):
                print(f"attention splits={splits}: WRONG")
                continue
            ms = graph_replay_ms(lambda: [run(i) for i in range(copies)], 10) / copies
            print(f"attention B=1 kv {seq} max_kv_len {max_len} splits={splits}: {ms * 1e3:.2f} us per call (2 "
                  f"launches)", flush=True)  # fmt: skip


if __name__ == "__main__":
    gdn_decode()
    if "--gdn_only" not in sys.argv:
        attention()
    print("small kernels check OK")
