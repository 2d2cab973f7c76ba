"""draft_window against a row-by-row oracle written from its definition, and the Triton kernel against the
reference under the Triton interpreter."""

import textwrap

import pytest
import torch

from lightllm_mtp.kernels.speculative.draft_inputs import draft_window
from unit_tests.triton_interpreter import run_interpreted

HOLD = 999


def random_case(seed, num_prepend, rows, lookahead, bsz=4, width=40, slots=6, position_shift=0):
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, 20, (bsz, 3), generator=g)[:, 1]  # a column slice, as the engine's DraftState rows
    start[0] = 0  # a window clamped at position 0
    accept = torch.randint(1, rows - num_prepend + 1, (bsz, 2), generator=g)[:, 0]
    masks = torch.randint(0, 3, (bsz,), generator=g)
    req = torch.randperm(slots, generator=g)[:bsz].to(torch.int32)
    row0 = torch.arange(bsz) * 7 + 3
    tokens = torch.randint(0, 500, (bsz, num_prepend + rows + 2), generator=g)
    tokens[1, -2:] = -1
    tokens = tokens[:, 1:]  # not contiguous either
    table = torch.randint(0, 300, (slots + 1, width), generator=g, dtype=torch.int32)
    return dict(b_start=start, b_accept_len=accept, b_num_masks=masks, b_req_idx=req, b_row0=row0, b_tokens=tokens,
                req_to_token=table, hold_slot=HOLD, num_prepend=num_prepend, rows=rows, lookahead=lookahead,
                context_base=100, mask_index=1000, position_shift=position_shift)  # fmt: skip


def oracle(c):
    """Draft-model windows (position_shift 1): the same rows one position on, with that position's KV slot."""
    P, R, M, S = c["num_prepend"], c["rows"], c["lookahead"], c["position_shift"]
    pos_l, mem_l, hid_l, nxt_l, seq_l, anc_l, ctx_l = [], [], [], [], [], [], []
    for b in range(c["b_start"].shape[0]):
        start, acc = int(c["b_start"][b]), int(c["b_accept_len"][b])
        req, newest = int(c["b_req_idx"][b]), start + acc
        w0 = max(start - P, 0)
        tok = {start - P + 1 + i: int(t) for i, t in enumerate(c["b_tokens"][b]) if int(t) >= 0}
        for r in range(R):
            p = w0 + r
            pos_l.append(p + S)
            if p < newest:
                mem_l.append(int(c["req_to_token"][req, p + S]))
                hid_l.append(int(c["b_row0"][b]) + p - start if p >= start else 100 + req * P + P - (start - p))
                nxt_l.append([tok.get(p + 1 + m, -1) if p + 1 + m <= newest else -1 for m in range(M)])
            else:
                is_mask = p < newest + int(c["b_num_masks"][b])
                mem_l.append(int(c["req_to_token"][req, p + S]) if is_mask else HOLD)
                hid_l.append(1000)
                nxt_l.append([-1] * M)
        seq_l.append(w0 + R + S)
        anc_l.append(b * R + newest - 1 - w0)
        ctx_l.append([b * R + newest - P + j - w0 if newest - P + j >= 0 else -1 for j in range(P)])
    return pos_l, mem_l, hid_l, nxt_l, seq_l, anc_l, ctx_l


@pytest.mark.parametrize("num_prepend,rows,lookahead,shift",
                         [(0, 4, 1, 0), (0, 8, 1, 0), (2, 6, 3, 0), (1, 3, 2, 0), (3, 8, 4, 0), (0, 4, 1, 1),
                          (0, 8, 1, 1)])  # fmt: skip
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_matches_oracle(num_prepend, rows, lookahead, shift, seed):
    c = random_case(seed, num_prepend, rows, lookahead, position_shift=shift)
    w = draft_window(**c)
    pos, mem, hid, nxt, seq, anc, ctx = oracle(c)
    assert w.positions.tolist() == pos
    assert w.mem_index.dtype == torch.int32 and w.mem_index.tolist() == mem
    assert w.hidden_index.tolist() == hid
    assert w.next_tokens.tolist() == nxt
    assert w.b_seq_len.tolist() == seq and w.b_anchor.tolist() == anc
    assert w.b_context_rows.tolist() == ctx


def test_validation():
    c = random_case(0, 1, 3, 2)
    c["b_accept_len"] = c["b_accept_len"][:2]
    with pytest.raises(ValueError, match="b_accept_len must have shape"):
        draft_window(**c)
    c = random_case(0, 1, 3, 2)
    c["b_tokens"] = c["b_tokens"].float()
    with pytest.raises(ValueError, match="b_tokens must have dtype"):
        draft_window(**c)


SCRIPT = textwrap.dedent(
    """
    import torch
    from lightllm_mtp.kernels.speculative import draft_inputs as di
    from unit_tests.kernels.speculative.test_draft_inputs import random_case
    for P, R, M, S in [(0, 4, 1, 0), (0, 8, 1, 0), (2, 6, 3, 0), (3, 8, 4, 0), (0, 4, 1, 1), (0, 8, 1, 1)]:
        for seed in range(3):
            c = random_case(seed, P, R, M, position_shift=S)
            args = [c[k] for k in ("b_start", "b_accept_len", "b_num_masks", "b_req_idx", "b_row0", "b_tokens",
                                   "req_to_token", "hold_slot", "num_prepend", "rows", "lookahead", "context_base",
                                   "mask_index", "position_shift")]
            ref, tri = di.draft_window_ref(*args), di.draft_window_triton(*args)
            for name in ref.__dataclass_fields__:
                a, b = getattr(ref, name), getattr(tri, name)
                assert a.dtype == b.dtype and torch.equal(a, b), (P, R, M, seed, name, a, b)
    print("ok")
    """
)


def test_triton_kernel_under_interpreter():
    pytest.importorskip("triton")
    out = run_interpreted(SCRIPT, timeout=600)
    assert "ok" in out, out[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("num_prepend,rows,lookahead,shift",
                         [(0, 4, 1, 0), (0, 14, 1, 0), (2, 6, 3, 0), (6, 14, 7, 0), (0, 6, 1, 1), (0, 14, 1, 1)])
def test_triton_matches_reference_gpu(num_prepend, rows, lookahead, shift):
    from lightllm_mtp.kernels.speculative import draft_inputs as di

    for seed in range(4):
        c = random_case(seed, num_prepend, rows, lookahead, bsz=33, width=64, slots=40, position_shift=shift)
        c = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in c.items()}
        args = [c[k] for k in ("b_start", "b_accept_len", "b_num_masks", "b_req_idx", "b_row0", "b_tokens",
                               "req_to_token", "hold_slot", "num_prepend", "rows", "lookahead", "context_base",
                               "mask_index", "position_shift")]  # fmt: skip
        ref, tri = di.draft_window_ref(*args), di.draft_window_triton(*args)
        for name in ref.__dataclass_fields__:
            assert torch.equal(getattr(ref, name), getattr(tri, name)), name
