"""Sampling: greedy, top-k/top-p filters, per-row generators, and empirical frequencies."""

import pytest
import torch

from lightllm_mtp.kernels.sampling.sampling import greedy_sample, processed_probs, sample

CHI2_7DOF_P1E4 = 29.9  # chi-square critical value, 7 degrees of freedom, p = 1e-4


def _params(n, temp=1.0, top_p=1.0, top_k=-1):
    return (torch.full((n,), temp), torch.full((n,), top_p), torch.full((n,), top_k, dtype=torch.int32))


def _chi2(counts, probs):
    expected = probs.double() * counts.sum()
    return float(((counts.double() - expected) ** 2 / expected).sum())


def test_greedy_rows_are_argmax():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    temps = torch.tensor([0.0, -1.0, 0.0, 0.0, 0.0, 0.0])
    gens = [torch.Generator().manual_seed(i) for i in range(6)]
    states = [g.get_state() for g in gens]
    out = sample(logits, temps, torch.full((6,), 0.9), torch.full((6,), 5, dtype=torch.int32), gens)
    assert out.dtype == torch.int64 and torch.equal(out, logits.argmax(-1))
    assert torch.equal(greedy_sample(logits), logits.argmax(-1))
    assert all(torch.equal(g.get_state(), s) for g, s in zip(gens, states))  # greedy consumes no randomness


@pytest.mark.parametrize("top_k,top_p", [(1, 1.0), (0, 1e-6), (7, 1e-6)])
def test_degenerate_filters_equal_greedy(top_k, top_p):
    logits = torch.randn(16, 100, generator=torch.Generator().manual_seed(top_k)) * 3
    gens = [torch.Generator().manual_seed(100 + i) for i in range(16)]
    out = sample(logits, *_params(16, 1.3, top_p, top_k), gens)
    assert torch.equal(out, logits.argmax(-1))


def test_same_seed_same_samples_and_mixed_batch():
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(3))
    temps = torch.tensor([1.0, 0.0, 0.7, 0.0, 2.0])
    top_ps = torch.tensor([1.0, 1.0, 0.9, 1.0, 1.0])
    top_ks = torch.tensor([-1, -1, 10, -1, 0], dtype=torch.int32)

    def draw(seed_base, n=30):
        gens = [torch.Generator().manual_seed(seed_base + i) for i in range(5)]
        return torch.stack([sample(logits, temps, top_ps, top_ks, gens) for _ in range(n)])

    a, b, c = draw(0), draw(0), draw(1000)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.equal(a[:, 1], logits[1].argmax().expand(30)) and torch.equal(a[:, 3], logits[3].argmax().expand(30))
    # a sampled row's tokens depend only on its own generator, not on the other rows of the batch
    g = torch.Generator().manual_seed(2)
    alone = torch.stack([sample(logits[2:3], temps[2:3], top_ps[2:3], top_ks[2:3], [g]) for _ in range(30)])
    assert torch.equal(alone[:, 0], a[:, 2])


@pytest.mark.parametrize("use_generator", [True, False])
def test_frequencies_match_softmax(use_generator):
    vocab, n = 8, 16000
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(4))
    batch = logits.expand(n, vocab).contiguous()
    if use_generator:
        g = torch.Generator().manual_seed(123)
        gens = [g] * n
    else:
        torch.manual_seed(123)
        gens = [None] * n
    out = sample(batch, *_params(n), gens)
    counts = torch.bincount(out, minlength=vocab)
    assert _chi2(counts, torch.softmax(logits.double(), -1)) < CHI2_7DOF_P1E4


def test_temperature_top_k_top_p_distribution():
    probs0 = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    logits = probs0.log()[None].repeat(4, 1)
    temps = torch.tensor([1.0, 0.5, 1.0, 1.0])
    top_ps = torch.tensor([1.0, 1.0, 0.7, 0.7])
    top_ks = torch.tensor([3, -1, -1, 2], dtype=torch.int32)
    p = processed_probs(logits, temps, top_ps, top_ks)
    assert p.dtype == torch.float32
    expected = torch.zeros(4, 6, dtype=torch.float64)
    expected[0, :3] = probs0[:3].double() / probs0[:3].sum()  # top-k 3
    sq = probs0.double() ** 2  # temperature 0.5
    expected[1] = sq / sq.sum()
    expected[2, :3] = probs0[:3].double() / probs0[:3].sum()  # 0.4 + 0.25 < 0.7 <= 0.8: three tokens
    expected[3, :2] = probs0[:2].double() / probs0[:2].sum()  # top-k 2 first, then top-p keeps both
    torch.testing.assert_close(p.double(), expected, rtol=1e-5, atol=1e-6)
    # sampled frequencies follow the filtered distribution
    n = 6000
    torch.manual_seed(7)
    out = sample(logits[2:3].expand(n, 6), *_params(n, 1.0, 0.7, -1), [None] * n)
    assert int(out.max()) <= 2
    counts = torch.bincount(out, minlength=3)[:3]
    assert _chi2(counts, expected[2, :3]) < 18.4  # 2 dof, p = 1e-4


def test_validation():
    logits = torch.randn(3, 10)
    t, p, k = _params(3)
    with pytest.raises(ValueError, match=": top_ks must"):
        sample(logits, t, p, k.float(), [None] * 3)
    with pytest.raises(ValueError, match=": temperatures must"):
        sample(logits, t[:2], p, k, [None] * 3)
    with pytest.raises(ValueError, match="generators"):
        sample(logits, t, p, k, [None] * 2)
