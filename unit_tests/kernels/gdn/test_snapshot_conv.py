"""snapshot_conv_windows: the conv windows of prefix-cache snapshots against a per-position construction; the
Triton kernel against the reference under the Triton interpreter."""

import textwrap

import pytest
import torch

from lightllm_mtp.common.state_snapshots import build_snapshot_plan
from lightllm_mtp.kernels.gdn.snapshot_conv import snapshot_conv_windows
from unit_tests.triton_interpreter import run_interpreted


def _case(seed: int):
    """Three requests' chunks (start, rows) with boundaries inside, at the chunk start + 1 (history columns) and at
    the chunk's end; request 1 has no conv history (a fresh prompt)."""
    torch.manual_seed(seed)
    cols, conv_dim = 3, 10
    chunks, has_state = [(5, 7), (0, 4), (9, 6)], [True, False, True]
    cuts = [[(6, 0), (8, 4), (12, 2)], [(1, 1), (4, 3)], [(10, 5), (15, 6)]]
    rows = sum(n for _, n in chunks)
    plan = build_snapshot_plan(chunks, has_state, cuts, cols, rows, torch.device("cpu"))
    x = torch.randn(rows, conv_dim + 4)[:, 2 : 2 + conv_dim]  # a column slice of the in_proj output, as in the layer
    conv_state = torch.randn(4, conv_dim, cols + 2)  # widened slot (MTP): history is columns [0, K-1)
    b_state_idx = torch.tensor([2, 0, 3], dtype=torch.int32)
    b_has = torch.tensor(has_state)
    return chunks, cuts, plan, x, conv_state, b_state_idx, b_has


def test_windows_equal_the_inputs_before_each_boundary():
    chunks, cuts, plan, x, conv_state, b_state_idx, b_has = _case(0)
    cols = conv_state.shape[2] - 2
    snap = torch.full((7, x.shape[1], cols), float("nan"))
    snapshot_conv_windows(x, conv_state, snap, conv_index=plan.conv_index, conv_slots=plan.conv_slots,
                          b_state_idx=b_state_idx, b_has_initial_state=b_has)  # fmt: skip
    row0 = 0
    for b, ((start, n), c) in enumerate(zip(chunks, cuts)):
        for pos, slot in c:
            for j, q in enumerate(range(pos - cols, pos)):
                if q >= start:
                    want = x[row0 + q - start]
                elif b_has[b]:
                    want = conv_state[int(b_state_idx[b]), :, q - start + cols]
                else:
                    want = torch.zeros(x.shape[1])
                assert torch.equal(snap[slot, :, j], want), (b, pos, j)
        row0 += n


def test_validation():
    _, _, plan, x, conv_state, b_state_idx, b_has = _case(1)
    snap = torch.zeros(7, x.shape[1], 3)
    with pytest.raises(ValueError, match="conv_index must"):
        snapshot_conv_windows(x, conv_state, snap, conv_index=plan.conv_index[:, :2], conv_slots=plan.conv_slots,
                              b_state_idx=b_state_idx, b_has_initial_state=b_has)  # fmt: skip
    with pytest.raises(ValueError, match="b_has_initial_state must have dtype"):
        snapshot_conv_windows(x, conv_state, snap, conv_index=plan.conv_index, conv_slots=plan.conv_slots,
                              b_state_idx=b_state_idx, b_has_initial_state=b_has.int())  # fmt: skip
    with pytest.raises(ValueError, match="fewer than"):
        snapshot_conv_windows(x, conv_state[:, :, :2], snap, conv_index=plan.conv_index, conv_slots=plan.conv_slots,
                              b_state_idx=b_state_idx, b_has_initial_state=b_has)  # fmt: skip


SCRIPT = textwrap.dedent(
    """
    import torch
    import unit_tests.kernels.gdn.test_snapshot_conv as t
    from lightllm_mtp.kernels.gdn.snapshot_conv import snapshot_conv_windows_ref, snapshot_conv_windows_triton
    for seed in range(2):
        _, _, plan, x, conv_state, b_state_idx, b_has = t._case(seed)
        x = x.to(torch.bfloat16); conv_state = conv_state.to(torch.bfloat16)
        ref, out = (torch.full((7, x.shape[1], 3), -1.0, dtype=torch.bfloat16) for _ in range(2))
        snapshot_conv_windows_ref(x, conv_state, ref, conv_index=plan.conv_index, conv_slots=plan.conv_slots,
                                  b_state_idx=b_state_idx, b_has_initial_state=b_has)
        snapshot_conv_windows_triton(x, conv_state, out, plan.conv_index, plan.conv_slots, b_state_idx, b_has)
        assert torch.equal(out, ref), seed
    print("ok")
    """
)


def test_triton_kernel_under_interpreter():
    pytest.importorskip("triton")
    out = run_interpreted(SCRIPT)
    assert out.strip().endswith("ok"), out[-3000:]


@pytest.mark.gpu
def test_triton_matches_reference_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for seed in range(3):
        _, _, plan, x, conv_state, b_state_idx, b_has = _case(seed)
        args = [t.cuda() for t in (x, conv_state)]
        ref, out = (torch.full((7, x.shape[1], 3), -1.0, device="cuda") for _ in range(2))
        kw = dict(conv_index=plan.conv_index.cuda(), conv_slots=plan.conv_slots.cuda(), b_state_idx=b_state_idx.cuda(),
                  b_has_initial_state=b_has.cuda())  # fmt: skip
        from lightllm_mtp.kernels.gdn.snapshot_conv import snapshot_conv_windows_ref

        snapshot_conv_windows_ref(*args, ref, **kw)
        snapshot_conv_windows(*args, out, **kw)
        assert torch.equal(out, ref)
