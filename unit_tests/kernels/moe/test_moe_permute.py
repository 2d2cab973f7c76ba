"""sort_by_expert, moe_permute, moe_unpermute: the prefill MoE path's expert-sorted layout and its weighted return."""

import textwrap

import pytest
import torch

from lightllm_mtp.kernels.moe.moe_permute import (
    moe_permute,
    moe_permute_ref,
    moe_unpermute,
    moe_unpermute_ref,
    sort_by_expert,
)  # fmt: skip
from unit_tests.triton_interpreter import run_interpreted


def _ids(t, k, experts, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(t)])


def test_sort_by_expert_groups_pairs_stably():
    ids = _ids(30, 3, 11, seed=1)
    ids[ids >= 5] += 1  # expert 5 idle, and 12, 13 at the end
    order, ends = sort_by_expert(ids.to(torch.int32), num_experts=14)
    flat = ids.flatten()
    counts = torch.bincount(flat, minlength=14)
    assert ends.dtype == torch.int32 and torch.equal(ends.long(), counts.cumsum(0))
    assert torch.equal(flat[order], torch.sort(flat).values)
    for e in range(14):  # within an expert, pairs in increasing index
        start = 0 if e == 0 else int(ends[e - 1])
        group = order[start : int(ends[e])]
        assert torch.equal(group, torch.sort(group).values)


def test_references_against_loops():
    gen = torch.Generator().manual_seed(2)
    t, k, hidden = 7, 3, 10
    x = torch.randn(t, hidden, generator=gen)
    order = torch.randperm(t * k, generator=gen)
    rows, pos = moe_permute_ref(x, order, top_k=k)
    for r in range(t * k):
        p = int(order[r])
        assert torch.equal(rows[r], x[p // k]) and int(pos[p // k, p % k]) == r
    down = torch.randn(t * k, hidden, generator=gen).bfloat16()
    w = torch.rand(t, k, generator=gen)
    out = moe_unpermute_ref(down, pos, w)
    assert out.dtype == torch.bfloat16
    expected = torch.stack([sum(w[i, j] * down[pos[i, j]].float() for j in range(k)) for i in range(t)])
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)
    # permute then unpermute with unit weights and down = the rows: k * x
    torch.testing.assert_close(moe_unpermute(rows, pos, torch.ones(t, k)), k * x)


def test_validation():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="moe_permute: order must have shape"):
        moe_permute(x, torch.arange(7), top_k=2)
    with pytest.raises(ValueError, match="order must have dtype"):
        moe_permute(x, torch.arange(8).float(), top_k=2)
    with pytest.raises(ValueError, match="top_k"):
        moe_permute(x, torch.arange(8), top_k=0)
    pos = torch.arange(8, dtype=torch.int32).view(4, 2)
    with pytest.raises(ValueError, match="moe_unpermute: down must have shape"):
        moe_unpermute(torch.randn(7, 8), pos, torch.ones(4, 2))
    with pytest.raises(ValueError, match="topk_weights must have shape"):
        moe_unpermute(torch.randn(8, 8), pos, torch.ones(4, 3))
    with pytest.raises(ValueError, match="pos must have dtype"):
        moe_unpermute(torch.randn(8, 8), pos.float(), torch.ones(4, 2))
    with pytest.raises(ValueError, match="num_experts"):
        sort_by_expert(pos, num_experts=0)


PERMUTE_INTERPRET_SCRIPT = textwrap.dedent(
    """
    import torch
    from lightllm_mtp.kernels.moe import moe_permute as m
    gen = torch.Generator().manual_seed(0)
    # (T, k, E, H, dtype, weights dtype): H below / above / not a multiple of the column tile, one slot, one token
    cases = ((9, 3, 6, 40, torch.float32, torch.float32), (33, 2, 5, 1030, torch.bfloat16, torch.bfloat16),
             (1, 8, 16, 64, torch.bfloat16, torch.float32), (13, 1, 3, 24, torch.float32, torch.bfloat16))
    for t, k, experts, hidden, dt, wdt in cases:
        x = torch.randn(t, hidden + 5, generator=gen).to(dt)[:, 2 : 2 + hidden]  # strided rows
        ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(t)])
        order, _ = m.sort_by_expert(ids, num_experts=experts)
        rows, pos = m.moe_permute_triton(x, order, top_k=k)
        rows_ref, pos_ref = m.moe_permute_ref(x, order, top_k=k)
        assert torch.equal(rows, rows_ref) and torch.equal(pos, pos_ref)
        down = torch.randn(t * k, hidden, generator=gen).to(dt)
        w = torch.rand(t, k + 2, generator=gen).to(wdt)[:, 1 : 1 + k]  # strided weights
        out = m.moe_unpermute_triton(down, pos, w)
        ref = m.moe_unpermute_ref(down, pos, w)
        assert out.dtype == dt
        tol = 1e-5 if dt == torch.float32 else 1e-2  # fp32 sums in another order, then one rounding to bf16
        torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
        if hidden > 64:
            continue
        tile = m.CopyTile(2, 16, 1)  # several column programs; pos written by the first only
        rows2, pos2 = m.moe_permute_triton(x, order, top_k=k, tile=tile)
        assert torch.equal(rows2, rows_ref) and torch.equal(pos2, pos_ref)
        assert torch.equal(m.moe_unpermute_triton(down, pos, w, tile=tile), out)  # the same sum per element
    print("OK")
    """
)


def test_permute_kernels_under_the_interpreter():
    pytest.importorskip("triton")
    out = run_interpreted(PERMUTE_INTERPRET_SCRIPT)
    assert "OK" in out, out[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("t", [130, 4096])
def test_permute_kernels_gpu_35b_a3b_shape(t):
    """Qwen3.5-35B-A3B MoE dims (256 experts, top-8, H 2048, bf16): the Triton kernels against the references,
    bit-identical on a second run, and sort + permute + unpermute free of host syncs."""
    gen = torch.Generator().manual_seed(t)
    experts, k, hidden = 256, 8, 2048
    x = torch.randn(t, hidden, generator=gen).bfloat16().cuda()
    ids = _ids(t, k, experts, seed=t).cuda()
    w = torch.softmax(torch.randn(t, k, generator=gen), dim=-1).bfloat16().cuda()
    down = torch.randn(t * k, hidden, generator=gen).bfloat16().cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        order, ends = sort_by_expert(ids, num_experts=experts)
        rows, pos = moe_permute(x, order, top_k=k)
        out = moe_unpermute(down, pos, w)
        again = moe_unpermute(down, pos, w)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    order_ref, ends_ref = sort_by_expert(ids.cpu(), num_experts=experts)
    assert torch.equal(order.cpu(), order_ref) and torch.equal(ends.cpu(), ends_ref)
    rows_ref, pos_ref = moe_permute_ref(x, order, top_k=k)
    assert torch.equal(rows, rows_ref) and torch.equal(pos, pos_ref)
    torch.testing.assert_close(out, moe_unpermute_ref(down, pos, w), rtol=1e-2, atol=1e-2)
    assert torch.equal(out, again)
