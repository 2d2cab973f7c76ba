"""Adaptive speculation length: the controller's choice on simulated acceptance schedules, and the engine exact
(greedy-identical, draft KV equal to a recompute, sampling distribution unchanged) whatever k each launch picks."""

import itertools
import random

import pytest

from benchmark.adaptive_grid import simulate
from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.spec_decode.adaptive import AcceptanceEstimate, SpecLengthController, StepCostTable, expected_tokens
from unit_tests.spec_decode.test_draft_kv import check_draft_kv
from unit_tests.spec_decode.test_greedy_equivalence import MAX_NEW, PROMPTS, greedy, mtp_kwargs
from unit_tests.spec_decode.test_trained_drafting import _chi2_homogeneity_p, plain_samples, prompts, sample_counts

K = 5
# step costs in ms at a 27B-like shape, H100 (benchmark/NOTES.md): decode ~20.4 ms; verify grows ~0.16 ms per row
# at B=1 and ~1.6 ms per row at B=32; eagle drafts 1.28 ms per draft forward (window pass + chain steps)
H100_LIKE = StepCostTable(
    (1, 32),
    (
        tuple(20.4 + 0.16 * k + 1.28 * max(k, 1) for k in range(K + 1)),
        tuple(25.5 + 1.6 * k + 1.9 * max(k, 1) for k in range(K + 1)),
    ),
)


def throughput(rates, costs, batch, k) -> float:
    return batch * expected_tokens(rates, k) / costs.row(batch)[k]


def test_expected_tokens_and_estimate():
    assert expected_tokens([0.5, 0.5], 0) == 1.0
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1.75)
    est = AcceptanceEstimate()
    est.observe(num_drafts=3, accepted_drafts=1)  # position 1 accepted, 2 rejected, 3 not reached
    assert est.reached == [1.0, 1.0] and est.accepted == [1.0, 0.0]
    rates = est.rates(3, prior=[0.5, 0.5, 0.5])
    assert rates[0] > 0.5 > rates[1] and rates[2] == 0.5


def test_cost_table_is_validated():
    with pytest.raises(ValueError, match="increase"):
        StepCostTable((4, 2), ((1.0, 2.0), (1.0, 2.0)))
    with pytest.raises(ValueError, match="positive"):
        StepCostTable((1,), ((0.0, 2.0),))
    assert H100_LIKE.row(5) == H100_LIKE.row(32) and H100_LIKE.row(64) == H100_LIKE.row(32)


@pytest.mark.parametrize("batch", [1, 32])
@pytest.mark.parametrize("rates", [[0.95] * K, [0.8, 0.6, 0.4, 0.3, 0.2], [0.6] * K, [0.3] * K, [0.1] * K],
                         ids=["a95", "decaying", "a60", "a30", "a10"])  # fmt: skip
def test_controller_reaches_the_best_fixed_k(rates, batch):
    """After a warm-up, the throughput of the chosen k (probe launches included) is >= 0.98x the best fixed k's."""
    chosen = simulate(H100_LIKE, batch, rates, launches=600, seed=0)[200:]
    best = max(throughput(rates, H100_LIKE, batch, k) for k in range(K + 1))
    got = sum(throughput(rates, H100_LIKE, batch, k) for k in chosen) / len(chosen)
    assert got >= 0.98 * best, (got / best, sorted(set(chosen)))


def test_controller_falls_back_to_plain_decoding_when_nothing_is_accepted():
    chosen = simulate(H100_LIKE, 1, [0.0] * K, launches=600, seed=0)[50:]
    assert chosen.count(0) >= 0.85 * len(chosen)  # the rest are probes of one draft
    assert max(chosen) <= 1


def test_controller_follows_a_request_whose_acceptance_decays():
    """A schedule that turns from well-predicted text to unpredictable text: k drops from high to 0."""
    controller = SpecLengthController(H100_LIKE)
    req, rng, chosen = AcceptanceEstimate(), random.Random(1), []
    for step in range(500):
        k = controller.choose([req])
        chosen.append(k)
        rate = 0.95 if step < 150 else 0.0
        accepted = 0
        while accepted < k and rng.random() < rate:
            accepted += 1
        controller.observe(req, k, accepted)
    assert sum(chosen[100:150]) / 50 >= 4 and chosen[400:].count(0) >= 80


def force_schedule(monkeypatch, schedule):
    """Every launch takes the next k of `schedule` (cycled): each transition between draft counts is exercised."""
    ks = itertools.cycle(schedule)
    monkeypatch.setattr(SpecLengthController, "choose",
                        lambda self, reqs, context_tokens=0: min(next(ks), self.max_drafts))  # fmt: skip


@pytest.fixture(params=["dense", "moe"])
def model_dir(request, tiny_dense_mtp3_dir, tiny_moe_mtp3_dir):
    return {"dense": tiny_dense_mtp3_dir, "moe": tiny_moe_mtp3_dir}[request.param]


@pytest.mark.parametrize("mode", ["eagle_with_att", "vanilla_with_att", "ptd"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "sync"])
def test_adaptive_greedy_equals_plain(monkeypatch, model_dir, mode, overlap):
    reference = [o.token_ids for o in LLM(model_dir, max_model_len=64).generate(PROMPTS, [greedy(n) for n in MAX_NEW])]
    force_schedule(monkeypatch, [0, 3, 1, 0, 2, 3, 3, 0, 0, 1])
    llm = LLM(model_dir, max_model_len=64, mtp_adaptive=True, disable_overlap=not overlap, **mtp_kwargs(mode, 3))
    outs = llm.generate(PROMPTS, [greedy(n) for n in MAX_NEW])
    assert [o.token_ids for o in outs] == reference
    at_k = outs[0].spec.steps_at_k
    assert at_k[0] > 0 and sum(at_k[1:]) > 0, at_k  # plain-decode steps and drafting steps both ran


def test_adaptive_with_its_own_choices_equals_plain(model_dir):
    """The controller's own choices (CPU: the row-count cost table), near max_model_len too."""
    reference = [o.token_ids for o in LLM(model_dir, max_model_len=40).generate(PROMPTS, greedy(40))]
    outs = LLM(model_dir, max_model_len=40, mtp_adaptive=True, mtp_mode="eagle_with_att", mtp_step=3).generate(
        PROMPTS, greedy(40)
    )
    assert [o.token_ids for o in outs] == reference


@pytest.mark.parametrize("mode", ["eagle", "multi_layer", "ptd"])
def test_adaptive_draft_kv_equals_recompute(monkeypatch, tiny_dense_mtp3_dir, mode):
    force_schedule(monkeypatch, [2, 0, 3, 1, 0, 0, 3])
    check_draft_kv(monkeypatch, tiny_dense_mtp3_dir, mode, 3, "cpu", mtp_adaptive=True)


def test_adaptive_sampling_is_exact(monkeypatch, trained_mtp3_ptd_dir, prompts, plain_samples):
    """Temperature 1, top-k 3: the joint distribution of three sampled tokens with k switching between 0, 1 and 2
    every launch equals plain sampling's (chi-square, 600 samples each, p > 1e-3)."""
    force_schedule(monkeypatch, [2, 0, 1])
    spec = sample_counts(trained_mtp3_ptd_dir, prompts[0][:24], mtp_mode="eagle_with_att", mtp_step=2,
                         mtp_adaptive=True)  # fmt: skip
    assert _chi2_homogeneity_p(plain_samples, spec) > 1e-3


def test_adaptive_needs_mtp():
    from lightllm_mtp.config.spec_config import SpecConfig

    with pytest.raises(ValueError, match="mtp_adaptive"):
        SpecConfig.from_args(None, 0, None, adaptive=True)
    with pytest.raises(ValueError, match="mtp_adaptive is not supported with mtp_mode draft_model"):
        SpecConfig.from_args("draft_model", 2, "/some/draft", adaptive=True)


def test_adaptive_and_draft_model_refused_under_tp_pp(tiny_dense_mtp3_dir):
    from lightllm_mtp.config.engine_args import EngineArgs

    with pytest.raises(ValueError, match="mtp_adaptive is not supported with tp/pp"):
        EngineArgs(model_dir=str(tiny_dense_mtp3_dir), mtp_mode="eagle_with_att", mtp_step=2, mtp_adaptive=True, tp=2)
    with pytest.raises(ValueError, match="draft_model is not supported with tp/pp"):
        EngineArgs(model_dir=str(tiny_dense_mtp3_dir), mtp_mode="draft_model", mtp_step=2,
                   mtp_draft_model_dir=str(tiny_dense_mtp3_dir), pp=2)  # fmt: skip


@pytest.mark.parametrize("mode", ["eagle_with_att", "ptd"])
def test_adaptive_with_prefix_cache_hits_equals_plain(monkeypatch, tiny_dense_mtp3_dir, mode):
    """Prompts sharing a prefix, generated twice (the second round resumes from the prefix cache, and from the
    first round's finished requests), with k switching every launch: plain greedy tokens both rounds."""
    shared = [7, 300, 12, 99, 4, 1500, 23, 8, 640, 5, 77, 31, 2, 900, 45, 6]
    prompts = [shared + [11, 12], shared + [13], shared[:9] + [600, 3]]
    plain = LLM(tiny_dense_mtp3_dir, max_model_len=64, prefix_cache=False)
    reference = [o.token_ids for o in plain.generate(prompts, greedy(12))]
    force_schedule(monkeypatch, [3, 0, 2, 1, 0])
    llm = LLM(tiny_dense_mtp3_dir, max_model_len=64, mtp_adaptive=True, prefix_cache_interval=4, prefix_cache_state_share=0.5,
              **mtp_kwargs(mode, 3))  # fmt: skip
    first = llm.generate(prompts, greedy(12))
    second = llm.generate(prompts, greedy(12))
    assert [o.token_ids for o in first] == reference and [o.token_ids for o in second] == reference
    assert sum(o.num_cached_tokens for o in second) > 0
