"""GPU check and timing of the Triton causal conv1d prefill kernel against its PyTorch reference at the 27B shape
(conv_dim 10240, K = 4, bf16, x a column slice of the in_proj output): a 16k-token single request and a ragged
batch with initial states; sweeps the conv launch's tile.

    python benchmark/check_conv1d_prefill_gpu.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from lightllm_mtp.kernels.gdn import causal_conv1d as conv


def _time_ms(fn, iters=20):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main():
    torch.manual_seed(0)
    dev, dt, c, kernel, proj = "cuda", torch.bfloat16, 10240, 4, 10240 + 6144 + 96
    for name, q_lens, init in (
        ("16k x 1", [16384], [False]),
        ("ragged 8", [3, 2048, 1, 4000, 2, 5000, 700, 4630], [True, False, True, True, False, True, True, False]),
    ):
        bsz = len(q_lens)
        cu = torch.tensor([0] + q_lens, device=dev).cumsum(0).to(torch.int32)
        x = torch.randn(int(cu[-1]), proj, device=dev, dtype=dt)[:, :c]
        weight = (torch.randn(c, kernel, device=dev) * 0.5).to(dt)
        state = torch.randn(bsz + 2, c, kernel - 1, device=dev, dtype=dt)
        slots = torch.arange(bsz, device=dev, dtype=torch.int32) + 1
        has = torch.tensor(init, device=dev)
        s_ref, s_tri = state.clone(), state.clone()
        ref = conv.causal_conv1d_prefill_ref(x, weight, s_ref, slots, cu, has)
        out = conv.causal_conv1d_prefill_triton(x, weight, s_tri, slots, cu, has)
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        assert err < 1e-2 and torch.equal(s_tri, s_ref), (err, (s_tri.float() - s_ref.float()).abs().max())
        t_ref = _time_ms(lambda: conv.causal_conv1d_prefill_ref(x, weight, state.clone(), slots, cu, has))
        gbytes = 2 * x.numel() * x.element_size() / 1e9
        print(f"{name}: rel err {err:.1e}, state exact; reference {t_ref:.3f} ms")
        for bt, bc, nw in ((8, 256, 4), (32, 128, 4), (16, 128, 2), (32, 64, 2)):
            s_cfg = state.clone()
            out_cfg = conv.causal_conv1d_prefill_triton(x, weight, s_cfg, slots, cu, has, bt, bc, nw)
            assert torch.equal(out_cfg, out) and torch.equal(s_cfg, s_ref)
            ms = _time_ms(lambda: conv.causal_conv1d_prefill_triton(x, weight, state.clone(), slots, cu, has, bt, bc, nw))
            print(f"  triton BLOCK_T {bt:3d} BLOCK_C {bc} warps {nw}: {ms:.3f} ms ({gbytes / ms * 1e3:.0f} GB/s x in+out)")
    print("conv1d prefill kernel OK")


if __name__ == "__main__":
    main()
