"""SparseMoE's decode path (one router+gate GEMM, then routing + alignment and the expert-major pass with the shared
expert folded in) against its reference path (top-k routing, per-expert experts, the shared MLP behind its gate),
with the Triton kernels run by the interpreter on CPU tensors; and the launches of that path counted: 1 GEMM + 4
kernels for a small step (T * (k+1) <= 64 pairs), 1 GEMM + 5 kernels above."""

import textwrap

import pytest
from unit_tests.triton_interpreter import run_interpreted

LAYER_INTERPRET_SCRIPT = textwrap.dedent(
    """
    import types
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from lightllm_mtp.common.layers.moe import SparseMoE
    from lightllm_mtp.config.model_config import MoEConfig
    from lightllm_mtp.kernels.moe import fused_moe, moe_align, moe_expert_pass, moe_route_align, moe_routing

    gen = torch.Generator().manual_seed(0)
    hidden, experts, top_k, inter, shared_inter = 32, 8, 2, 16, 24
    cfg = types.SimpleNamespace(moe=MoEConfig(experts, top_k, inter, shared_inter), hidden_size=hidden)
    names = {spec.name: spec.shape for spec in SparseMoE.specs(cfg, "mlp.")}
    weights = {name: torch.randn(*shape, generator=gen) * 0.3 for name, shape in names.items()}
    layer = SparseMoE(cfg, "mlp.", weights)
    launches = []
    inside = [False]
    class Counted:
        def __init__(self, kernel):
            self.kernel = kernel
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(self.kernel.fn.__name__ if hasattr(self.kernel, "fn") else str(self.kernel))
                inside[0] = True
                try:
                    return self.kernel[grid](*args, **kwargs)
                finally:
                    inside[0] = False
            return launch
    for mod, name in ((moe_routing, "_route_topk_kernel"), (moe_align, "_moe_align_kernel"),
                      (moe_expert_pass, "_gate_up_act_kernel"), (moe_expert_pass, "_down_weighted_kernel"),
                      (moe_expert_pass, "_sum_slots_kernel"), (moe_route_align, "_route_align_kernel")):
        setattr(mod, name, Counted(getattr(mod, name)))
    no_kernel = {"empty", "empty_strided", "view", "_unsafe_view", "t", "reshape", "as_strided", "detach", "alias",
                 "slice", "select", "transpose", "expand", "unsqueeze", "squeeze"}
    torch_ops = []
    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not inside[0] and func.overloadpacket.__name__ not in no_kernel:
                torch_ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))
    small = ["_route_align_kernel", "_gate_up_act_kernel", "_down_weighted_kernel", "_sum_slots_kernel"]
    large = ["_route_topk_kernel", "_moe_align_kernel", "_gate_up_act_kernel", "_down_weighted_kernel",
             "_sum_slots_kernel"]
    for tokens, expected_launches in ((6, small), (40, large)):  # 18 pairs; 120 pairs
        x = torch.randn(tokens, hidden, generator=gen)
        for mod in (fused_moe, moe_routing, moe_route_align):
            mod.use_triton = lambda t: False
        expected = layer.forward(x, None, None)  # CPU: the reference path
        for mod in (fused_moe, moe_routing, moe_route_align):  # the CUDA dispatch, on CPU tensors
            mod.use_triton = lambda t: True
        launches.clear()
        torch_ops.clear()
        with Ops():
            out = layer.forward(x, None, None)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        assert torch_ops == ["mm"], torch_ops
        assert launches == expected_launches, launches
    print("OK")
    """
)


def test_decode_path_matches_reference_path_with_one_gemm_and_three_or_five_kernels():
    pytest.importorskip("triton")
    out = run_interpreted(LAYER_INTERPRET_SCRIPT)
    assert "OK" in out, out[-3000:]


def test_padding_rows_are_zeroed_before_routing():
    """A prefill graph bucket's padding rows (ForwardBatch.padded: rows past b1_cu_q_len[B], garbage such as NaN)
    are zeroed before the router sees them: the real rows equal the unpadded forward's, the padding rows' outputs are
    finite (zero)."""
    import types

    import torch

    from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode
    from lightllm_mtp.common.layers.moe import SparseMoE
    from lightllm_mtp.config.model_config import MoEConfig

    gen = torch.Generator().manual_seed(1)
    hidden, real, bucket = 32, 5, 8
    cfg = types.SimpleNamespace(moe=MoEConfig(8, 2, 16, 24), hidden_size=hidden)
    weights = {s.name: torch.randn(*s.shape, generator=gen) * 0.3 for s in SparseMoE.specs(cfg, "mlp.")}
    layer = SparseMoE(cfg, "mlp.", weights)
    x = torch.randn(bucket, hidden, generator=gen)
    x[real:] = float("nan")
    ints = torch.zeros(bucket, dtype=torch.int64)
    batch = ForwardBatch(mode=ForwardMode.EXTEND, input_ids=ints, positions=ints, mem_index=ints.int(),
                         b_req_idx=torch.zeros(1, dtype=torch.int32), b_seq_len=torch.tensor([bucket]),
                         b1_cu_q_len=torch.tensor([0, real], dtype=torch.int32),
                         b_has_initial_state=torch.zeros(1, dtype=torch.bool), b_logits_index=ints[:1],
                         max_q_len=bucket, padded=True)  # fmt: skip
    assert batch.real_rows().flatten().tolist() == [True] * real + [False] * (bucket - real)
    out = layer.forward(x, batch, None)
    torch.testing.assert_close(out[:real], layer.forward(x[:real], None, None))
    assert torch.equal(out[real:], torch.zeros(bucket - real, hidden))
