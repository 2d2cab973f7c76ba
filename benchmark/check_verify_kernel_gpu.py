"""GPU check of the per-position gated-delta-rule verify kernel against its reference at the 27B shape
(48 value heads of 128 x 128, GVA 16 -> 48), at a small and a large batch (the two V-tile widths), fused gates.

    python benchmark/check_verify_kernel_gpu.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from lightllm_mtp.kernels.gdn import gated_delta_rule_verify as gdn
from lightllm_mtp.kernels.gdn.gdn_gating import gdn_gating_ref


def main():
    torch.manual_seed(0)
    dev = "cuda"
    for bsz in (1, 32):
        k, nk, nv, d = 1, 16, 48, 128
        rows = k + 1
        q_lens = torch.full((bsz,), k + 1)
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)]).to(torch.int32).to(dev)
        acc = torch.randint(1, k + 2, (bsz,), dtype=torch.int32, device=dev)
        T = int(cu[-1])
        qkv = torch.randn(T, (2 * nk + nv) * d, device=dev, dtype=torch.bfloat16)
        q, kk, v = (t.reshape(T, -1, d) for t in qkv.split([nk * d, nk * d, nv * d], dim=-1))
        ab = torch.randn(T, 2 * nv, device=dev, dtype=torch.bfloat16)
        a, b = ab[:, :nv], ab[:, nv:]
        A_log, dt_bias = torch.randn(nv, device=dev), torch.randn(nv, device=dev)
        base = torch.arange(bsz, dtype=torch.int32, device=dev) * rows
        ss = torch.randn(bsz * rows, nv, d, d, device=dev) * 0.1
        ss2 = ss.clone()
        g, beta = gdn_gating_ref(a, b, A_log, dt_bias)
        ref = gdn.gated_delta_rule_verify_ref(q, kk, v, g, beta, ss, base, cu, acc)
        out = gdn._verify_triton(q, kk, v, a, b, ss2, base, cu, acc, k + 1, A_log, dt_bias)
        err_o = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        err_s = ((ss2 - ss).norm() / ss.norm()).item()
        print(f"bsz {bsz}: rel err out {err_o:.2e}, state {err_s:.2e}")
        assert err_o < 1e-2 and err_s < 1e-4, (err_o, err_s)
    print("verify kernel OK")


if __name__ == "__main__":
    main()
