"""Causal conv1d + SiLU with per-request state against HF causal_conv1d_fn / causal_conv1d_update; the Triton
prefill and update kernels against the PyTorch references (interpreter on CPU, and on GPU)."""

import textwrap

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import causal_conv1d_fn, causal_conv1d_update as hf_update

from lightllm_mtp.kernels.gdn.causal_conv1d import causal_conv1d_prefill, causal_conv1d_update
from unit_tests.triton_interpreter import run_interpreted

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _hf_prefill(x, weight, history):
    """x [L, C], history [C, K-1] or None -> (silu conv outputs of the L new rows [L, C] fp32, last K-1 inputs)."""
    seq = x.float().t()
    if history is not None:
        seq = torch.cat([history.float(), seq], dim=1)
    y = causal_conv1d_fn(seq[None], weight.float(), None, activation="silu")[0]  # [C, len]
    kw = weight.shape[1]
    full = torch.cat([torch.zeros(seq.shape[0], kw - 1), seq], dim=1)
    return y[:, -x.shape[0] :].t(), full[:, -(kw - 1) :]


def _batch(q_lens, channels, dtype, seed, slots, num_slots, width, kernel):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(q_lens), channels, generator=gen).to(dtype)
    weight = (torch.randn(channels, kernel, generator=gen) * 0.5).to(dtype)
    state = torch.randn(num_slots, channels, width, generator=gen).to(dtype)
    cu = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    return x, weight, state, torch.tensor(slots, dtype=torch.int32), cu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernel,width", [(4, 3), (4, 6), (3, 2)])
def test_prefill_matches_hf(dtype, kernel, width):
    q_lens, slots, has_init = [6, 1, 2, 13], [4, 0, 2, 5], [False, True, True, False]
    x, weight, state, idx, cu = _batch(q_lens, 10, dtype, 40 + kernel + width, slots, 7, width, kernel)
    before = state.clone()
    out = causal_conv1d_prefill(
        x, weight, state, b_state_idx=idx, b1_cu_q_len=cu, b_has_initial_state=torch.tensor(has_init)
    )
    assert out.dtype == dtype and out.shape == x.shape
    for b, (slot, init) in enumerate(zip(slots, has_init)):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        history = before[slot, :, : kernel - 1] if init else None
        y, last = _hf_prefill(x[rows], weight, history)
        torch.testing.assert_close(out[rows].float(), y, **TOL[dtype])
        torch.testing.assert_close(state[slot, :, : kernel - 1].float(), last.to(dtype).float(), rtol=0, atol=0)
        torch.testing.assert_close(state[slot, :, kernel - 1 :], before[slot, :, kernel - 1 :], rtol=0, atol=0)
    untouched = [s for s in range(7) if s not in slots]
    assert torch.equal(state[untouched], before[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_update_matches_hf(dtype):
    kernel, slots = 4, [3, 0, 5]
    x, weight, state, idx, _ = _batch([1, 1, 1], 12, dtype, 7, slots, 6, 5, kernel)
    hf_state = state[slots, :, : kernel - 1].float().clone()
    before = state.clone()
    expected = hf_update(x.float()[:, :, None], hf_state, weight.float(), None, "silu")[:, :, 0]
    out = causal_conv1d_update(x, weight, state, b_state_idx=idx)
    torch.testing.assert_close(out.float(), expected, **TOL[dtype])
    torch.testing.assert_close(state[slots, :, : kernel - 1].float(), hf_state.to(dtype).float(), rtol=0, atol=0)
    torch.testing.assert_close(state[:, :, kernel - 1 :], before[:, :, kernel - 1 :], rtol=0, atol=0)


@pytest.mark.parametrize("splits", [[4, 1, 6], [1, 1, 9], [2, 9]])
def test_chunked_prefill_and_decode_equal_one_prefill(splits):
    """Prefill in pieces (state carried) then decode steps == one prefill of the whole sequence."""
    channels, kernel, total, decode_steps = 8, 4, 11, 3
    gen = torch.Generator().manual_seed(sum(splits) * 13 + len(splits))
    seq = torch.randn(total + decode_steps, channels, generator=gen)
    weight = torch.randn(channels, kernel, generator=gen)
    slot = torch.tensor([1], dtype=torch.int32)
    one_state = torch.randn(3, channels, kernel - 1, generator=gen)  # junk: has_initial_state=False ignores it
    full = causal_conv1d_prefill(
        seq, weight, one_state, b_state_idx=slot, b_has_initial_state=torch.tensor([False]),
        b1_cu_q_len=torch.tensor([0, total + decode_steps], dtype=torch.int32),
    )
    state = torch.randn(3, channels, kernel - 1, generator=gen)
    pieces, start = [], 0
    for i, n in enumerate(splits):
        cu = torch.tensor([0, n], dtype=torch.int32)
        has_state = torch.tensor([i > 0])
        pieces.append(
            causal_conv1d_prefill(seq[start : start + n], weight, state, b_state_idx=slot, b1_cu_q_len=cu,
                                  b_has_initial_state=has_state)
        )  # fmt: skip
        start += n
    for _ in range(decode_steps):
        pieces.append(causal_conv1d_update(seq[start : start + 1], weight, state, b_state_idx=slot))
        start += 1
    torch.testing.assert_close(torch.cat(pieces), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[1], one_state[1], rtol=1e-6, atol=1e-6)


def test_validation():
    x, w = torch.randn(5, 6), torch.randn(6, 4)
    state = torch.zeros(2, 6, 3)
    idx = torch.tensor([0], dtype=torch.int32)
    cu = torch.tensor([0, 5], dtype=torch.int32)
    meta = dict(b_state_idx=idx, b1_cu_q_len=cu, b_has_initial_state=torch.tensor([False]))
    with pytest.raises(ValueError, match=": weight must"):
        causal_conv1d_prefill(x, torch.randn(5, 4), state, **meta)
    with pytest.raises(ValueError, match="conv_state width"):
        causal_conv1d_prefill(x, w, torch.zeros(2, 6, 2), **meta)
    with pytest.raises(ValueError, match=": b_has_initial_state must"):
        causal_conv1d_prefill(x, w, state, b_state_idx=idx, b1_cu_q_len=cu, b_has_initial_state=torch.tensor([0]))
    with pytest.raises(ValueError, match=": b_state_idx must"):
        causal_conv1d_update(x, w, state, b_state_idx=idx)


@pytest.mark.gpu
@pytest.mark.parametrize("bsz", [1, 8, 32])
@pytest.mark.parametrize("width", [3, 5])
def test_update_triton_matches_reference_gpu(bsz, width):
    from lightllm_mtp.kernels.gdn.causal_conv1d import causal_conv1d_update_ref, causal_conv1d_update_triton

    torch.manual_seed(bsz + width)
    dev, dt, c, kernel = "cuda", torch.bfloat16, 10240, 4
    weight = (torch.randn(c, kernel, device=dev) * 0.5).to(dt)
    state = torch.randn(bsz + 3, c, width, device=dev).to(dt)
    ref_state = state.clone()
    idx = torch.randperm(bsz + 3, device=dev)[:bsz].to(torch.int32)
    for _ in range(3):
        x = torch.randn(bsz, c + 6144 + 96, device=dev).to(dt)[:, :c]  # strided rows, as in the layer
        out = causal_conv1d_update_triton(x, weight, state, idx)
        torch.testing.assert_close(out, causal_conv1d_update_ref(x, weight, ref_state, idx), rtol=1.6e-2, atol=1e-2)
        assert torch.equal(state, ref_state)


PREFILL_INTERPRET_SCRIPT = textwrap.dedent(
    """
    import torch
    from lightllm_mtp.kernels.gdn import causal_conv1d as conv
    torch.manual_seed(0)
    cases = [  # (q_lens, has_initial_state): ragged, empty and < K-1 requests, rows of several requests in a tile
        ([6, 1, 2, 13], [False, True, True, False]),
        ([1, 0, 3, 2, 40], [True, True, False, True, True]),
        ([2], [True]),
        ([37], [False]),
        ([3, 0, 1, 5] * 5, [True, False] * 10),  # > 16 requests: the search takes its second round of halvings
    ]
    for kernel in (4, 3):
        for channels, cu_dtype in ((12, torch.int32), (300, torch.int32), (7, torch.int64)):  # 300: 2 blocks, ragged
            for q_lens, init in cases:
                bsz = len(q_lens)
                cu = torch.tensor([0] + q_lens).cumsum(0).to(cu_dtype)
                x = torch.randn(int(cu[-1]), channels + 5)[:, 2 : 2 + channels]  # column slice, as in the layer
                w = torch.randn(channels, kernel)
                state = torch.randn(bsz + 3, channels, kernel + 1)  # wider slot: columns >= K-1 untouched
                slots = torch.randperm(bsz + 3)[:bsz].to(torch.int32)
                state2 = state.clone()
                has = torch.tensor(init)
                ref = conv.causal_conv1d_prefill_ref(x, w, state, slots, cu, has)
                out = conv.causal_conv1d_prefill_triton(x, w, state2, slots, cu, has)
                assert out.is_contiguous()
                torch.testing.assert_close(out, ref)
                torch.testing.assert_close(state2, state, rtol=0, atol=0)
    print("OK")
    """
)


def test_prefill_triton_matches_reference_under_the_interpreter():
    pytest.importorskip("triton")
    out = run_interpreted(PREFILL_INTERPRET_SCRIPT)
    assert "OK" in out, out[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("q_lens,init", [([4096], [False]), ([1, 2, 700, 3, 1500, 0, 33], [1, 1, 0, 1, 1, 0, 1])])
def test_prefill_triton_matches_reference_gpu(dtype, q_lens, init):
    from lightllm_mtp.kernels.gdn.causal_conv1d import causal_conv1d_prefill_ref

    torch.manual_seed(len(q_lens))
    dev, c, kernel = "cuda", 10240 + 40, 4  # not a multiple of the channel block
    bsz = len(q_lens)
    cu = torch.tensor([0] + q_lens, device=dev).cumsum(0).to(torch.int32)
    x = torch.randn(int(cu[-1]), c + 6144 + 96, device=dev).to(dtype)[:, :c]  # strided rows, as in the layer
    weight = (torch.randn(c, kernel, device=dev) * 0.5).to(dtype)
    state = torch.randn(bsz + 3, c, kernel + 2, device=dev).to(dtype)
    ref_state = state.clone()
    slots = torch.randperm(bsz + 3, device=dev)[:bsz].to(torch.int32)
    has = torch.tensor(init, device=dev, dtype=torch.bool)
    out = causal_conv1d_prefill(x, weight, state, b_state_idx=slots, b1_cu_q_len=cu, b_has_initial_state=has)
    ref = causal_conv1d_prefill_ref(x, weight, ref_state, slots, cu, has)
    tol = dict(rtol=1.6e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, ref, **tol)
    assert torch.equal(state, ref_state)


# ---- causal_conv1d_prefill_qkv: the GDN prefill's conv with contiguous q | k | v planes, q and k L2-normalised ----
def test_prefill_qkv_is_conv_split_and_l2norm():
    from lightllm_mtp.kernels.gdn.causal_conv1d import causal_conv1d_prefill_qkv

    key_dim, head_dim, value_dim = 12, 4, 8
    q_lens, slots, has_init = [6, 1, 2], [4, 0, 2], [False, True, True]
    x, weight, state, idx, cu = _batch(q_lens, 2 * key_dim + value_dim, torch.float32, 3, slots, 7, 3, 4)
    state2 = state.clone()
    meta = dict(b_state_idx=idx, b1_cu_q_len=cu, b_has_initial_state=torch.tensor(has_init))
    q, k, v = causal_conv1d_prefill_qkv(x, weight, state, **meta, key_dim=key_dim, head_dim=head_dim)
    y = causal_conv1d_prefill(x, weight, state2, **meta)
    assert torch.equal(state, state2)
    for got, want in ((q, y[:, :key_dim]), (k, y[:, key_dim : 2 * key_dim])):
        assert got.is_contiguous() and got.shape == want.shape
        heads = want.reshape(-1, key_dim // head_dim, head_dim)
        normed = (heads * torch.rsqrt(heads.pow(2).sum(-1, keepdim=True) + 1e-6)).reshape(want.shape)
        torch.testing.assert_close(got, normed, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.reshape(heads.shape).norm(dim=-1), torch.ones(heads.shape[:2]), rtol=0,
                                   atol=1e-3)  # fmt: skip
    torch.testing.assert_close(v, y[:, 2 * key_dim :], rtol=0, atol=0)
    with pytest.raises(ValueError, match="head_dim"):
        causal_conv1d_prefill_qkv(x, weight, state, **meta, key_dim=key_dim, head_dim=5)
    with pytest.raises(ValueError, match="2 \\* key_dim"):
        causal_conv1d_prefill_qkv(x, weight, state, **meta, key_dim=20, head_dim=4)
    with pytest.raises(ValueError, match="b1_cu_q_len must"):
        causal_conv1d_prefill_qkv(x, weight, state, **dict(meta, b1_cu_q_len=cu[:-1]), key_dim=key_dim, head_dim=4)


PREFILL_QKV_INTERPRET_SCRIPT = textwrap.dedent(
    """
    import torch
    from lightllm_mtp.kernels.gdn import causal_conv1d as conv
    torch.manual_seed(0)
    # (key_dim, head_dim, value_dim, channel block): blocks of one head, of several heads across the q | k and
    # k | v boundaries, one ragged block holding everything
    layouts = ((16, 8, 24, 16), (32, 16, 48, 32), (8, 8, 16, 256))
    for kernel in (4, 3):
        for key_dim, head_dim, value_dim, block_c in layouts:
            for q_lens, init in (([6, 1, 2, 13], [False, True, True, False]), ([1, 0, 3], [True, True, False])):
                c, bsz = 2 * key_dim + value_dim, len(q_lens)
                cu = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
                x = torch.randn(int(cu[-1]), c + 5)[:, 2 : 2 + c]  # column slice, as in the layer
                w = torch.randn(c, kernel)
                state = torch.randn(bsz + 3, c, kernel + 1)
                slots = torch.randperm(bsz + 3)[:bsz].to(torch.int32)
                state2 = state.clone()
                has = torch.tensor(init)
                ref = conv.causal_conv1d_prefill_qkv_ref(x, w, state, slots, cu, has, key_dim, head_dim)
                out = conv.causal_conv1d_prefill_qkv_triton(x, w, state2, slots, cu, has, key_dim, head_dim,
                                                            block_c=block_c)
                for got, want in zip(out, ref):
                    assert got.is_contiguous() and got.shape == want.shape
                    torch.testing.assert_close(got, want)
                torch.testing.assert_close(state2, state, rtol=0, atol=0)
    print("OK")
    """
)


def test_prefill_qkv_triton_matches_reference_under_the_interpreter():
    pytest.importorskip("triton")
    out = run_interpreted(PREFILL_QKV_INTERPRET_SCRIPT)
    assert "OK" in out, out[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("q_lens,init", [([4096], [False]), ([1, 2, 700, 3, 1500, 0, 33], [1, 1, 0, 1, 1, 0, 1])])
def test_prefill_qkv_triton_matches_reference_gpu(q_lens, init):
    from lightllm_mtp.kernels.gdn.causal_conv1d import causal_conv1d_prefill_qkv, causal_conv1d_prefill_qkv_ref

    torch.manual_seed(len(q_lens))
    dev, dt, key_dim, head_dim, c, kernel = "cuda", torch.bfloat16, 2048, 128, 10240, 4  # 27B: 16 + 16 + 48 heads
    bsz = len(q_lens)
    cu = torch.tensor([0] + q_lens, device=dev).cumsum(0).to(torch.int32)
    x = torch.randn(int(cu[-1]), c + 6144 + 96, device=dev).to(dt)[:, :c]  # strided rows, as in the layer
    weight = (torch.randn(c, kernel, device=dev) * 0.5).to(dt)
    state = torch.randn(bsz + 3, c, kernel + 2, device=dev).to(dt)
    ref_state = state.clone()
    slots = torch.randperm(bsz + 3, device=dev)[:bsz].to(torch.int32)
    has = torch.tensor(init, device=dev, dtype=torch.bool)
    meta = dict(b_state_idx=slots, b1_cu_q_len=cu, b_has_initial_state=has)
    out = causal_conv1d_prefill_qkv(x, weight, state, **meta, key_dim=key_dim, head_dim=head_dim)
    ref = causal_conv1d_prefill_qkv_ref(x, weight, ref_state, slots, cu, has, key_dim, head_dim)
    for got, want in zip(out, ref):
        assert got.is_contiguous()
        torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)
    assert torch.equal(state, ref_state)
