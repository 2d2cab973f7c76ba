"""Forced acceptance through the engine (mtp_force_acceptance, benchmarking): the requested mean accept length and
per-position rates over long runs on the tiny random checkpoint (whose real drafts are almost never accepted), the
same accept lengths from every proposer and with or without overlap scheduling (the coin lives in the one verify
path), state kept right (a draft model equal to the target still decodes as plain decoding), and a verify step that
costs what a step of real acceptance at that length costs."""

import statistics
import time

import pytest

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.spec_decode.stats import SpecStats
from lightllm_mtp.tools.make_tiny_checkpoint import build_tiny_checkpoint

K = 3


def seeded_greedy(n: int, seed: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True, seed=seed)


def forced_stats(model_dir, forced: str, num_requests: int, new_tokens: int, **kwargs) -> SpecStats:
    """Acceptance counts over num_requests seeded greedy requests of new_tokens tokens each."""
    llm = LLM(model_dir, mtp_mode=kwargs.pop("mtp_mode", "eagle_with_att"), mtp_step=K, mtp_force_acceptance=forced,
              max_model_len=new_tokens + 64, max_batch_size=num_requests, **kwargs)  # fmt: skip
    prompts = [[3 + i, 40 + 7 * i, 11, 250 + i] for i in range(num_requests)]
    outs = llm.generate(prompts, [seeded_greedy(new_tokens, seed=i) for i in range(num_requests)])
    assert all(len(o.token_ids) == new_tokens for o in outs)
    total = SpecStats()
    for o in outs:
        total = total + o.spec
    assert total.proposed_at == (total.verify_steps,) * K  # every block held k drafts: the rates apply as given
    return total


def conditional_rates(stats: SpecStats) -> list[float]:
    """P(draft i accepted | drafts before it were) = accepted at i / accepted at i - 1."""
    reached = (stats.verify_steps,) + stats.accepted_at[:-1]
    return [a / r for a, r in zip(stats.accepted_at, reached)]


@pytest.mark.slow
def test_long_run_gives_the_requested_mean_and_rates(tiny_dense_dir):
    """>= 8,000 verify blocks at mean=2.2 (standard deviation of one block's accept length 1.18: standard error of
    the mean <= 0.013, so 0.05 is ~4 of them); >= 4,000 at 0.8,0.6,0.4."""
    mean = forced_stats(tiny_dense_dir, "mean=2.2", num_requests=32, new_tokens=560)
    assert mean.verify_steps >= 8000
    assert mean.tokens_per_step == pytest.approx(2.2, abs=0.05)
    rates = forced_stats(tiny_dense_dir, "0.8,0.6,0.4", num_requests=16, new_tokens=700)
    assert rates.verify_steps >= 4000
    assert conditional_rates(rates) == pytest.approx([0.8, 0.6, 0.4], abs=0.04)
    assert rates.tokens_per_step == pytest.approx(1 + 0.8 + 0.48 + 0.192, abs=0.06)


def test_short_run_gives_the_requested_mean_and_rates(tiny_dense_dir):
    """The default suite's version: ~1,000 blocks (standard error of the mean ~0.037)."""
    mean = forced_stats(tiny_dense_dir, "mean=2.2", num_requests=8, new_tokens=280)
    assert mean.verify_steps >= 950
    assert mean.tokens_per_step == pytest.approx(2.2, abs=0.12)
    rates = forced_stats(tiny_dense_dir, "0.8,0.6,0.4", num_requests=8, new_tokens=280)
    assert conditional_rates(rates) == pytest.approx([0.8, 0.6, 0.4], abs=0.08)


@pytest.fixture(scope="module")
def small_draft(tmp_path_factory):
    """A small random draft model (with a PARD mask token) of the tiny targets' vocabulary."""
    return build_tiny_checkpoint("qwen3_5", tmp_path_factory.mktemp("forced_small_draft"), mtp_layers=0, seed=3,
                                 draft=True, pard=True)  # fmt: skip


def test_every_proposer_and_overlap_setting_draws_the_same_accept_lengths(tiny_dense_dir, tiny_dense_mtp3_dir,
                                                                          small_draft):  # fmt: skip
    """Seeded requests draw their coin from their own generator inside the one verify path: eagle, parallel
    drafting, multi-layer MTP, a draft model and PARD, with and without overlap scheduling, accept the same."""
    run = dict(forced="0.9,0.7,0.5", num_requests=4, new_tokens=60)
    draft = dict(mtp_mode="draft_model", mtp_draft_model_dir=small_draft)
    reference = forced_stats(tiny_dense_dir, **run)
    assert reference.accepted_drafts > reference.verify_steps  # the drafts of random weights: accepted by force
    for model_dir, kwargs in [
        (tiny_dense_dir, dict(disable_overlap=True)),
        (tiny_dense_dir, dict(prefix_cache=False)),
        (tiny_dense_mtp3_dir, dict(parallel_drafting=True)),
        (tiny_dense_mtp3_dir, dict(mtp_mode="vanilla_with_att")),
        (tiny_dense_dir, draft),
        (tiny_dense_dir, dict(**draft, parallel_drafting=True)),
    ]:
        assert forced_stats(model_dir, **run, **kwargs) == reference, kwargs


def test_outputs_change_but_the_committed_state_stays_right(tiny_dense_dir):
    """Accepted drafts are emitted as they are, so random drafts change the output; a draft model equal to the target
    drafts the target's own tokens, so whatever prefix the coin accepts, the output is plain decoding's: the KV and
    GDN state behind every accepted row are the ones the verify computed."""
    prompts = [[5, 17, 300, 42, 9], [900, 4, 4, 250], [31, 8, 222]]
    params = [seeded_greedy(40, seed=i) for i in range(3)]
    plain = [o.token_ids for o in LLM(tiny_dense_dir, max_model_len=128).generate(prompts, params)]
    eagle = LLM(tiny_dense_dir, max_model_len=128, mtp_mode="eagle_with_att", mtp_step=K,
                mtp_force_acceptance="mean=3").generate(prompts, params)  # fmt: skip
    assert [o.token_ids for o in eagle] != plain
    own = LLM(tiny_dense_dir, max_model_len=128, mtp_mode="draft_model", mtp_step=K, mtp_draft_model_dir=tiny_dense_dir,
              mtp_force_acceptance="0.6,0.6,0.6").generate(prompts, params)  # fmt: skip
    assert [o.token_ids for o in own] == plain
    total = sum((o.spec for o in own), SpecStats())
    assert 1.5 < total.tokens_per_step < 2.6  # the coin's 1.96, not the 4 real acceptance of an identical draft gives


def timed_full_steps(engines, prompts, new_tokens) -> list[list[float]]:
    """Steps the engines in turn on the same requests; per engine, the time of each step in which every request runs
    a verify block. Time is this process's CPU time: with one intra-op thread it is the step's work, where wall time
    on a shared 2-core machine also counts the turns of other processes."""
    reqs = [[e.add_request(p, SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True))
             for p in prompts] for e in engines]  # fmt: skip
    times = [[] for _ in engines]
    while any(e.has_unfinished() for e in engines):
        for e, own, out in zip(engines, reqs, times):
            if not e.has_unfinished():
                continue
            full = not e.scheduler.waiting and all(not r.in_prefill and r.blocks for r in own)
            start = time.process_time()
            e.step()
            if full and all(r.finish_reason is None for r in own):
                out.append(time.process_time() - start)
    return times


def test_a_forced_step_costs_what_real_acceptance_at_that_length_costs(trained_dense_dir):
    """The trained tiny checkpoint's real acceptance at k = 3 is measured first; forced acceptance at that mean then
    runs the same workload, each step beside the real engine's step of the same index (similar context): the median
    of the per-step time ratios is about 1 (a forced step does the real rule's device work plus one draw)."""
    from transformers import AutoTokenizer

    from lightllm_mtp.tools.tiny_corpus import heldout_prompts, split_corpus

    tokenizer = AutoTokenizer.from_pretrained(trained_dense_dir)
    prompts = [ids[:48] for _, ids in heldout_prompts(tokenizer, split_corpus().heldout, 4, 48)]
    common = dict(mtp_mode="eagle_with_att", mtp_step=K, max_model_len=256, max_batch_size=4, prefix_cache=False)
    real = LLMEngine(EngineArgs(str(trained_dense_dir), **common))
    params = SamplingParams(temperature=0.0, max_new_tokens=96, ignore_eos=True)
    measured = [real.add_request(p, params) for p in prompts]
    while real.has_unfinished():
        real.step()
    length = sum((r.spec_stats for r in measured), SpecStats()).tokens_per_step
    assert length > 1.5  # a trained head: real acceptance to compare with
    forced = LLMEngine(EngineArgs(str(trained_dense_dir), **common, mtp_force_acceptance=f"mean={length:.3f}"))
    timed_full_steps([forced], prompts, 16)  # warm-up
    real_s, forced_s = timed_full_steps([real, forced], prompts, 96)
    assert min(len(real_s), len(forced_s)) >= 15
    ratio = statistics.median(f / r for r, f in zip(real_s, forced_s))
    assert 0.8 <= ratio <= 1.25, (ratio, real_s, forced_s)
