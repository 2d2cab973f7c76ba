"""The accept rule: greedy first-mismatch, and speculative sampling that preserves the target distribution."""

import math

import pytest
import torch

from lightllm_mtp.kernels.sampling.sampling import processed_probs
from lightllm_mtp.spec_decode.verify import verify_block


def test_greedy_first_mismatch_and_bonus():
    vocab = 10
    logits = torch.full((3, 4, vocab), -5.0)
    targets = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 0, 1, 2]]
    for b, row in enumerate(targets):
        for i, t in enumerate(row):
            logits[b, i, t] = 5.0
    drafts = torch.tensor([[1, 2, 3], [5, 9, 7], [4, 0, 1]])
    n = torch.tensor([3, 3, 2])
    zeros = torch.zeros(3)
    res = verify_block(logits, drafts, n, zeros, torch.ones(3), torch.full((3,), -1), [None] * 3)
    # all accepted + bonus; one accepted then target's token; none accepted (draft 4 != target 9)
    assert res.b_accept_len.tolist() == [4, 2, 1]
    assert res.emitted.tolist() == [[1, 2, 3, 4], [5, 6, -1, -1], [9, -1, -1, -1]]


def _chi_square_p_value(counts, probs, trials):
    expected = probs * trials
    mask = expected > 5
    stat = float((((counts - expected) ** 2) / expected.clamp_min(1e-9))[mask].sum())
    dof = int(mask.sum()) - 1
    # Wilson-Hilferty normal approximation of the chi-square tail
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("greedy_draft", [True, False])
def test_speculative_sampling_preserves_target_distribution(greedy_draft):
    """Emitted tokens at each position follow the target distribution even when the draft is far from it."""
    vocab, k, trials = 8, 2, 12000
    gen = torch.Generator().manual_seed(0)
    target_logits = torch.randn(1, k + 1, vocab, generator=gen) * 1.5
    draft_logits = -target_logits[:, :k] + torch.randn(1, k, vocab, generator=gen)  # deliberately far from target
    temp = torch.tensor([0.8])
    p = processed_probs(target_logits[0], temp.expand(k + 1), torch.ones(k + 1), torch.full((k + 1,), -1))
    q = torch.softmax(draft_logits / 0.8, dim=-1)
    first = torch.zeros(vocab)
    second_given = torch.zeros(vocab)
    second_trials = 0
    for t in range(trials):
        if greedy_draft:
            drafts = torch.tensor([[3, 5]])
            draft_probs = None
        else:
            drafts = torch.multinomial(q[0], 1, generator=gen).view(1, k)
            draft_probs = q
        g = torch.Generator().manual_seed(10_000 + t)
        res = verify_block(target_logits, drafts, torch.tensor([k]), temp, torch.ones(1), torch.tensor([-1]), [g],
                           draft_probs=draft_probs)
        emitted = res.emitted[0]
        first[emitted[0]] += 1
        # with a fixed draft, the second token follows target row 1 whenever draft 1 was accepted
        if greedy_draft and res.b_accept_len[0] >= 2:
            second_given[emitted[1]] += 1
            second_trials += 1
    assert _chi_square_p_value(first, p[0], trials) > 1e-3
    if greedy_draft:
        assert second_trials > 500
        assert _chi_square_p_value(second_given, p[1], second_trials) > 1e-3


def test_top_k_top_p_are_applied_to_the_target():
    logits = torch.tensor([[[4.0, 3.0, 2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 9.0]]])
    counts = torch.zeros(5)
    for t in range(400):
        g = torch.Generator().manual_seed(t)
        res = verify_block(logits, torch.tensor([[3]]), torch.tensor([1]), torch.tensor([1.0]), torch.tensor([1.0]),
                           torch.tensor([2]), [g])
        counts[res.emitted[0, 0]] += 1
    assert counts[2:].sum() == 0  # top_k=2 keeps tokens 0 and 1 only; draft 3 is never accepted


def test_batched_rows_mix_greedy_and_sampling():
    """One verify_block call over many requests: sampled rows follow the target distribution, temperature-0 rows
    in the same batch follow the greedy rule exactly, seeded rows are reproducible."""
    vocab, k, n = 6, 2, 4000
    gen = torch.Generator().manual_seed(1)
    target_logits = (torch.randn(1, k + 1, vocab, generator=gen) * 1.5).expand(n, -1, -1).contiguous()
    drafts = torch.tensor([[2, 4]]).expand(n, -1).contiguous()
    temps = torch.where(torch.arange(n) % 4 == 0, 0.0, 0.9)  # every 4th request greedy
    res = verify_block(target_logits, drafts, torch.full((n,), k), temps, torch.ones(n), torch.full((n,), -1),
                       [None] * n)  # fmt: skip
    greedy = verify_block(target_logits[:1], drafts[:1], torch.tensor([k]), torch.zeros(1), torch.ones(1),
                          torch.tensor([-1]), [None], greedy_only=True)  # fmt: skip
    g_rows = torch.arange(n) % 4 == 0
    assert (res.emitted[g_rows] == greedy.emitted[0]).all() and (res.b_accept_len[g_rows] == greedy.b_accept_len[0]).all()
    p = processed_probs(target_logits[0], torch.full((k + 1,), 0.9), torch.ones(k + 1), torch.full((k + 1,), -1))
    sampled = res.emitted[~g_rows, 0]
    counts = torch.bincount(sampled, minlength=vocab).float()
    assert _chi_square_p_value(counts, p[0], int(sampled.numel())) > 1e-3
    seeded = [verify_block(target_logits[:3], drafts[:3], torch.full((3,), k), torch.full((3,), 0.9), torch.ones(3),
                           torch.full((3,), -1), [None, torch.Generator().manual_seed(7), None]).emitted[1]
              for _ in range(2)]  # fmt: skip
    assert torch.equal(seeded[0], seeded[1])
