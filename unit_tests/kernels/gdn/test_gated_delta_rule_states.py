"""Prefill that saves states at token counts: o and final states equal the plain prefill's, every saved state equals a
prefill that stops there; the snapshot plan splits a chunk only at boundaries off the save alignment."""

import pytest
import torch

from lightllm_mtp.common.state_snapshots import _segments, build_snapshot_plan
from lightllm_mtp.kernels.gdn.gated_delta_rule import gated_delta_rule_prefill
from lightllm_mtp.kernels.gdn.gated_delta_rule_states import (
    gated_delta_rule_prefill_states,
    make_state_saves,
)


def _inputs(t, nk, nv, dk, dv, gen, device="cpu", dtype=torch.float32):
    q, k = (torch.randn(t, nk, dk, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(t, nv, dv, generator=gen).to(dtype)
    g = -torch.rand(t, nv, generator=gen) * 0.2
    beta = torch.rand(t, nv, generator=gen)
    return [x.to(device) for x in (q, k, v, g, beta)]


def _check(q_lens, saves, has_init, device="cpu", dtype=torch.float32, nk=2, nv=4, dk=16, dv=8, exact=True):
    gen = torch.Generator().manual_seed(sum(q_lens))
    cu = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32).to(device)
    q, k, v, g, beta = _inputs(int(cu[-1]), nk, nv, dk, dv, gen, device, dtype)
    slots = torch.arange(len(q_lens), dtype=torch.int64, device=device) * 2 + 1
    init = torch.tensor(has_init, device=device)
    ssm0 = (torch.randn(2 * len(q_lens) + 1, nv, dk, dv, generator=gen) * 0.3).to(device)
    ssm_a, ssm_b = ssm0.clone(), ssm0.clone()
    states = torch.zeros(len(saves) + 2, nv, dk, dv, device=device)
    o = gated_delta_rule_prefill_states(
        q, k, v, g, beta, ssm_a, states, b_state_idx=slots, b1_cu_q_len=cu, b_has_initial_state=init,
        saves=make_state_saves(q_lens, saves, torch.device(device)),
    )
    o_plain = gated_delta_rule_prefill(q, k, v, g, beta, ssm_b, b_state_idx=slots, b1_cu_q_len=cu,
                                       b_has_initial_state=init)  # fmt: skip
    cmp = torch.equal if exact else (lambda a, b: torch.allclose(a, b, rtol=2e-3, atol=2e-3))
    assert cmp(o, o_plain) and cmp(ssm_a, ssm_b)
    for b, t, dest in saves:  # a prefill of the request's first t rows alone
        ssm_c = ssm0.clone()
        rows = slice(int(cu[b]), int(cu[b]) + t)
        gated_delta_rule_prefill(
            q[rows], k[rows], v[rows], g[rows], beta[rows], ssm_c, b_state_idx=slots[b : b + 1],
            b1_cu_q_len=torch.tensor([0, t], dtype=torch.int32, device=device), b_has_initial_state=init[b : b + 1],
        )
        assert cmp(states[dest], ssm_c[slots[b]]), (b, t)
    untouched = [i for i in range(states.shape[0]) if i not in {d for _, _, d in saves}]
    assert not states[untouched].any()


def test_saved_states_equal_a_prefill_that_stops_there():
    _check([7, 3, 12], [(0, 2, 0), (0, 7, 1), (2, 1, 2), (2, 9, 3), (2, 12, 4)], [True, False, False])


def test_bad_saves_are_rejected():
    with pytest.raises(ValueError, match="outside"):
        make_state_saves([4, 2], [(1, 3, 0)], torch.device("cpu"))
    with pytest.raises(ValueError, match="rows"):
        make_state_saves([4, 0], [], torch.device("cpu"))
    q, k, v, g, beta = _inputs(6, 1, 2, 8, 8, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="saves describe"):
        gated_delta_rule_prefill_states(
            q, k, v, g, beta, torch.zeros(2, 2, 8, 8), torch.zeros(2, 2, 8, 8),
            b_state_idx=torch.tensor([0]), b1_cu_q_len=torch.tensor([0, 6], dtype=torch.int32),
            b_has_initial_state=torch.tensor([False]), saves=make_state_saves([5], [], torch.device("cpu")),
        )


def test_segments_split_only_off_the_alignment():
    # chunk [100, 400): boundaries at 128 (off 64 from 100: split), then 192, 256 (aligned from 128), end 400
    cuts = [(128, 0), (192, 1), (256, 2), (400, 3)]
    assert _segments(100, 300, cuts, 64) == [(100, 128, [(28, 0)]), (128, 400, [(64, 1), (128, 2), (272, 3)])]
    assert _segments(100, 300, cuts, 1) == [(100, 400, [(28, 0), (92, 1), (156, 2), (300, 3)])]
    whole_only = [(100, 128, [(28, 0)]), (128, 192, [(64, 1)]), (192, 256, [(64, 2)]), (256, 400, [(144, 3)])]
    assert _segments(100, 300, cuts, 1 << 62) == whole_only  # without fla's forward steps: split at every boundary
    plan = build_snapshot_plan([(0, 256), (100, 300)], [False, True], [[(256, 5)], cuts], 3, 556,
                               torch.device("cpu"), 64)  # fmt: skip
    assert len(plan.pieces) == 2
    first, second = plan.pieces
    assert first.saves.q_lens == (256, 28) and first.saves.saves == ((0, 256, 5), (1, 28, 0))
    assert first.b_has_initial_state.tolist() == [False, True]
    assert second.saves.q_lens == (272,) and second.b_index.tolist() == [1]
    assert second.rows.tolist() == list(range(256 + 28, 556))
    one = build_snapshot_plan([(0, 256), (100, 300)], [False, True], [[(256, 5)], cuts], 3, 556, torch.device("cpu"))
    assert len(one.pieces) == 1 and one.pieces[0].rows is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("nk,nv,dk,dv", [(2, 4, 128, 128), (16, 48, 128, 128)])
def test_fla_saved_states_bitwise_gpu(nk, nv, dk, dv):
    """fla path: o and final states bitwise the plain fla prefill's; states at multiples of 64 and at the ends
    bitwise a prefill stopped there (the chunk states are fp32, never rounded)."""
    q_lens = [1000, 64, 193, 512]
    saves = [(0, 256, 0), (0, 512, 1), (0, 1000, 2), (1, 64, 3), (2, 128, 4), (2, 193, 5), (3, 448, 6)]
    _check(q_lens, saves, [False, True, True, False], "cuda", torch.bfloat16, nk, nv, dk, dv)


@pytest.mark.parametrize("q_lens", [[5], [64, 3], [130, 64, 1], [7, 7, 7, 7]])
def test_state_saves_parts_start_16_byte_aligned(q_lens):
    """Triton specializes pointer arguments on 16-byte alignment: every device part of a StateSaves starts aligned
    whatever the request count, so fla's kernels compile once (an odd offset compiled them again mid-serving)."""
    saves = make_state_saves(q_lens, [(b, n, b) for b, n in enumerate(q_lens)], torch.device("cpu"))
    parts = [saves.cu_seqlens, saves.chunk_indices, saves.chunk_offsets, saves.inner_chunk, saves.inner_dest,
             saves.final_b, saves.final_dest]  # fmt: skip
    base = saves.cu_seqlens.data_ptr()
    assert all((p.data_ptr() - base) % 16 == 0 for p in parts)
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    assert saves.cu_seqlens.tolist() == cu
    assert saves.chunk_indices.tolist() == [[b, i] for b, n in enumerate(q_lens) for i in range(-(-n // 64))]
    assert saves.final_b.tolist() == list(range(len(q_lens))) and saves.final_dest.tolist() == list(range(len(q_lens)))
