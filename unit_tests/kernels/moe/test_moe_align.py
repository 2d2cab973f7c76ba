"""moe_align: (token, slot) pairs grouped by expert, each group padded to BLOCK_M, the block -> expert map."""

import textwrap

import pytest
import torch

from lightllm_mtp.kernels.moe.moe_align import max_blocks, moe_align, moe_align_ref
from unit_tests.triton_interpreter import run_interpreted


def _ids(t, k, experts, seed, shared=False):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(t)])
    if shared:  # every token also selects expert `experts`, as route_topk(shared_gate=True) writes slot k
        ids = torch.cat([ids, torch.full((t, 1), experts)], dim=1)
    return ids.to(torch.int32)


@pytest.mark.parametrize("t,k,experts,block_m,shared",
                         [(5, 2, 8, 4, False), (33, 3, 6, 16, True), (1, 8, 256, 16, True)])  # fmt: skip
def test_reference_layout(t, k, experts, block_m, shared):
    ids = _ids(t, k, experts, seed=t, shared=shared)
    total = experts + int(shared)
    sorted_pairs, block_expert = moe_align_ref(ids, num_experts=total, block_m=block_m)
    n_pairs = ids.numel()
    assert block_expert.numel() == max_blocks(n_pairs, total, block_m)
    assert sorted_pairs.numel() == block_expert.numel() * block_m
    flat = ids.flatten()
    seen = []
    for b, e in enumerate(block_expert.tolist()):
        rows = sorted_pairs[b * block_m : (b + 1) * block_m]
        if e < 0:
            assert (rows == n_pairs).all()
            continue
        real = rows[rows < n_pairs]
        assert (flat[real.long()] == e).all() and len(real) > 0
        seen += real.tolist()
    assert sorted(seen) == list(range(n_pairs))  # every pair exactly once
    used = block_expert[block_expert >= 0]
    assert torch.equal(used, torch.sort(used).values)  # expert-major
    assert (block_expert[len(used):] == -1).all()


def test_max_blocks_is_tight_for_one_token():
    assert max_blocks(9, 257, 16) == 9  # decode at B=1: 8 routed + the shared expert, one block each
    assert max_blocks(64 * 9, 257, 16) == (576 + 257 * 15) // 16


def test_validation():
    with pytest.raises(ValueError, match="block_m"):
        moe_align(torch.zeros(2, 2, dtype=torch.int32), num_experts=4, block_m=12)
    with pytest.raises(ValueError, match="topk_ids must have dtype"):
        moe_align(torch.zeros(2, 2), num_experts=4, block_m=16)


ALIGN_INTERPRET_SCRIPT = textwrap.dedent(
    """
    import torch
    from lightllm_mtp.kernels.moe import moe_align as a
    gen = torch.Generator().manual_seed(0)
    for t, k, experts, block_m in ((5, 3, 8, 16), (40, 4, 6, 16), (1, 9, 257, 16), (70, 3, 5, 4), (300, 2, 3, 8)):
        ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(t)]).int()  # 300*2: 5 programs
        s, b = a.moe_align_triton(ids, num_experts=experts, block_m=block_m)
        s_ref, b_ref = a.moe_align_ref(ids, num_experts=experts, block_m=block_m)
        used = int((b_ref >= 0).sum())
        assert torch.equal(b, b_ref), (b, b_ref)
        assert torch.equal(s[: used * block_m], s_ref[: used * block_m]), (s, s_ref)
    print("OK")
    """
)


def test_align_kernel_under_the_interpreter():
    pytest.importorskip("triton")
    out = run_interpreted(ALIGN_INTERPRET_SCRIPT)
    assert "OK" in out, out[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 8, 32, 64, 128])
def test_align_kernel_gpu_35b_a3b_shape(t):
    ids = _ids(t, 8, 256, seed=t, shared=True).cuda()
    s, b = moe_align(ids, num_experts=257, block_m=16)
    s_ref, b_ref = moe_align_ref(ids.cpu(), num_experts=257, block_m=16)
    used = int((b_ref >= 0).sum())
    assert torch.equal(b.cpu(), b_ref) and torch.equal(s.cpu()[: used * 16], s_ref[: used * 16])
