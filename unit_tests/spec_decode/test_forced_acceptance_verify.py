"""Forced acceptance in the verify rule (benchmarking, mtp_force_acceptance): drafts are accepted by a coin at each
position's conditional rate, never checked against the target; rows before the first refused draft emit the drafts,
that row the target's token; seeded requests draw their own coin."""

import pytest
import torch

from lightllm_mtp.config.forced_acceptance import ForcedAcceptance, expected_accept_length
from lightllm_mtp.kernels.sampling.sampling import processed_probs
from lightllm_mtp.spec_decode.verify import ForcedAcceptRule, verify_block
from unit_tests.spec_decode.test_rejection_sampling import _chi_square_p_value

VOCAB = 16


def rule(text: str, k: int) -> ForcedAcceptRule:
    return ForcedAcceptRule.on_device(ForcedAcceptance.parse(text, k), torch.device("cpu"))


def greedy_verify(logits, drafts, num_drafts, forced, generators=None):
    bsz = logits.shape[0]
    return verify_block(logits, drafts, num_drafts, None, None, None, generators or [None] * bsz, greedy_only=True,
                        draw_width=drafts.shape[1], forced=forced)  # fmt: skip


def conditional_rates(accept_len: torch.Tensor, k: int) -> list[float]:
    """P(draft i accepted | drafts before it were), from accept lengths of blocks of k drafts."""
    m = accept_len.long() - 1
    return [float((m > i).sum() / (m >= i).sum()) for i in range(k)]


def test_per_position_rates_and_what_is_emitted():
    bsz, k = 100_000, 3
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(bsz, k + 1, VOCAB, generator=gen)
    drafts = torch.randint(0, VOCAB, (bsz, k), generator=gen)
    res = greedy_verify(logits, drafts, torch.full((bsz,), k), rule("0.8,0.6,0.4", k))
    # 48,000 blocks reach position 3: the standard error of its rate is 0.0023
    assert conditional_rates(res.b_accept_len, k) == pytest.approx([0.8, 0.6, 0.4], abs=0.01)
    assert res.b_accept_len.float().mean() == pytest.approx(expected_accept_length((0.8, 0.6, 0.4)), abs=0.01)
    target = logits.argmax(dim=-1)
    for b in range(200):
        m = int(res.b_accept_len[b]) - 1
        assert res.emitted[b].tolist() == drafts[b, :m].tolist() + [int(target[b, m])] + [-1] * (k - m)


def test_drafts_are_not_checked_either_way():
    """Rate 0 refuses drafts the target agrees with; rate 1 accepts drafts it disagrees with (plus the bonus)."""
    k = 3
    logits = torch.randn(4, k + 1, VOCAB, generator=torch.Generator().manual_seed(1))
    target = logits.argmax(dim=-1)
    right, wrong = target[:, :k], (target[:, :k] + 1) % VOCAB
    assert greedy_verify(logits, right, torch.full((4,), k), None).b_accept_len.tolist() == [4] * 4  # the real rule
    none = greedy_verify(logits, right, torch.full((4,), k), rule("0", k))
    assert none.b_accept_len.tolist() == [1] * 4 and none.emitted[:, 0].tolist() == target[:, 0].tolist()
    every = greedy_verify(logits, wrong, torch.full((4,), k), rule("mean=4", k))
    assert every.b_accept_len.tolist() == [4] * 4
    assert torch.equal(every.emitted, torch.cat([wrong, target[:, k:]], dim=1))


def test_accept_length_is_capped_by_each_blocks_drafts():
    bsz, k = 4000, 3
    logits = torch.randn(bsz, k + 1, VOCAB, generator=torch.Generator().manual_seed(2))
    num_drafts = torch.arange(bsz) % (k + 1)  # 0..3 drafts (adaptive speculation, near max_model_len)
    res = greedy_verify(logits, torch.zeros(bsz, k, dtype=torch.long), num_drafts, rule("1,1,1", k))
    assert torch.equal(res.b_accept_len.long(), num_drafts + 1)


def test_seeded_requests_draw_their_own_coin():
    """A seeded request's accept lengths depend on its seed only, not on the batch around it or the rule's default
    generator; requests without a seed draw from the rule's generator."""
    k, steps = 3, 50
    logits = torch.randn(3, k + 1, VOCAB, generator=torch.Generator().manual_seed(3))
    drafts = torch.zeros(3, k, dtype=torch.long)

    def run(generators, forced):
        return [greedy_verify(logits, drafts, torch.full((3,), k), forced, generators).b_accept_len.tolist()
                for _ in range(steps)]  # fmt: skip

    alone = run([None, torch.Generator().manual_seed(7), None], rule("mean=2.2", k))
    other = run([torch.Generator().manual_seed(8), torch.Generator().manual_seed(7), None], rule("mean=2.2", k))
    assert [a[1] for a in alone] == [o[1] for o in other]
    assert [a[0] for a in alone] != [a[2] for a in alone]  # rows without a seed: different draws of one generator
    assert run([None] * 3, rule("mean=2.2", k)) == run([None] * 3, rule("mean=2.2", k))  # the rule's fixed seed


def test_sampled_rows_emit_the_target_distribution_at_the_first_refused_row():
    bsz, k = 30_000, 2
    gen = torch.Generator().manual_seed(4)
    row_logits = torch.randn(1, k + 1, VOCAB, generator=gen) * 1.5
    logits = row_logits.expand(bsz, -1, -1).contiguous()
    drafts = torch.randint(0, VOCAB, (bsz, k), generator=gen)
    temps = torch.full((bsz,), 0.9)
    res = verify_block(logits, drafts, torch.full((bsz,), k), temps, torch.ones(bsz), torch.full((bsz,), -1),
                       [None] * bsz, draw_width=k, forced=rule("0.7,0.5", k))  # fmt: skip
    assert conditional_rates(res.b_accept_len, k) == pytest.approx([0.7, 0.5], abs=0.015)
    p = processed_probs(row_logits[0], temps[: k + 1], torch.ones(k + 1), torch.full((k + 1,), -1))
    m = res.b_accept_len.long() - 1
    for row in range(k + 1):  # the token after the accepted drafts follows that row's p
        tokens = res.emitted[m == row, row]
        counts = torch.bincount(tokens, minlength=VOCAB).float()
        assert _chi_square_p_value(counts, p[row], int(tokens.numel())) > 1e-3, row
    accepted = res.emitted[m >= 1, 0]
    assert torch.equal(accepted, drafts[m >= 1, 0])
