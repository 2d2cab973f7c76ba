"""Speculative decoding on block-FP8 targets (the trained tiny fixtures in the published -FP8 layout, FP8 MTP
heads): greedy output equal to plain decoding of the same FP8 model in every drafting mode (eagle, multi-layer, PTD,
an external draft model, adaptive), with the prefix cache and overlap on (the defaults) and off; speculative
sampling exact (chi-square against plain sampling, as test_trained_drafting does for 16-bit)."""

import pytest

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.tools.tiny_corpus import heldout_prompts, split_corpus
from unit_tests.spec_decode.test_trained_drafting import _chi2_homogeneity_p, sample_counts

MAX_LEN = 160
LENGTHS, MAX_NEW = [96, 41, 17, 70], [40, 23, 33, 12]


@pytest.fixture(scope="module")
def prompts(trained_dense_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained_dense_dir)  # one tokenizer for every tiny fixture
    return [ids[:n] for (_, ids), n in zip(heldout_prompts(tokenizer, split_corpus().heldout, 4, 96), LENGTHS)]


def greedy():
    return [SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True) for n in MAX_NEW]


def _check(model_dir, prompts, **kw):
    plain = [o.token_ids for o in LLM(str(model_dir), max_model_len=MAX_LEN).generate(prompts, greedy())]
    llm = LLM(str(model_dir), max_model_len=MAX_LEN, chunked_prefill_size=32, **kw)
    outs = llm.generate(prompts, greedy())
    assert [o.token_ids for o in outs] == plain
    assert sum(o.spec.accepted_drafts for o in outs) > 0  # the FP8 drafts are accepted
    return llm, outs


@pytest.mark.parametrize("mode, step", [("eagle_with_att", 1), ("eagle_with_att", 3), ("vanilla_with_att", 3),
                                        ("ptd", 3)])  # fmt: skip
def test_mtp_modes_greedy_equal_plain(fp8_mtp3_ptd_dir, prompts, mode, step):
    kw = dict(mtp_mode="eagle_with_att", parallel_drafting=True) if mode == "ptd" else dict(mtp_mode=mode)
    _check(fp8_mtp3_ptd_dir, prompts, mtp_step=step, **kw)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "sync"])
def test_moe_eagle_greedy_equals_plain(fp8_moe_dir, prompts, overlap):
    _check(fp8_moe_dir, prompts, mtp_mode="eagle_with_att", mtp_step=2, disable_overlap=not overlap)


def test_draft_model_on_an_fp8_target(fp8_dense_dir, trained_draft_dir, prompts):
    _check(fp8_dense_dir, prompts, mtp_mode="draft_model", mtp_step=2, mtp_draft_model_dir=str(trained_draft_dir))


def test_adaptive_on_an_fp8_target(fp8_dense_dir, prompts):
    _check(fp8_dense_dir, prompts, mtp_mode="eagle_with_att", mtp_step=3, mtp_adaptive=True)


def test_online_fp8_eagle(trained_dense_dir, prompts):
    plain = [o.token_ids for o in LLM(str(trained_dense_dir), max_model_len=MAX_LEN, quantization="fp8").generate(
        prompts, greedy())]  # fmt: skip
    outs = LLM(str(trained_dense_dir), max_model_len=MAX_LEN, quantization="fp8", mtp_mode="eagle_with_att",
               mtp_step=2).generate(prompts, greedy())  # fmt: skip
    assert [o.token_ids for o in outs] == plain and sum(o.spec.accepted_drafts for o in outs) > 0


def test_prefix_cache_resumes_and_changes_nothing(fp8_dense_dir, prompts):
    """A second round resending each prompt plus its answer: served from the tree, tokens as without the cache."""
    kw = dict(max_model_len=MAX_LEN + 48, mtp_mode="eagle_with_att", mtp_step=2, prefix_cache_interval=16)
    first = [o.token_ids for o in LLM(str(fp8_dense_dir), prefix_cache=False, **kw).generate(prompts, greedy())]
    second_round = [p + out[:8] for p, out in zip(prompts, first)]
    no_cache = LLM(str(fp8_dense_dir), prefix_cache=False, **kw)
    cached = LLM(str(fp8_dense_dir), **kw)
    want = [o.token_ids for o in no_cache.generate(second_round, greedy())]
    assert [o.token_ids for o in cached.generate(prompts, greedy())] == first
    outs = cached.generate(second_round, greedy())
    assert [o.token_ids for o in outs] == want
    assert all(o.num_cached_tokens >= 16 for o in outs)


def test_speculative_sampling_is_exact_under_fp8(fp8_mtp3_ptd_dir, prompts):
    """Temperature 1, top-k 3: the joint distribution of three sampled tokens with eagle k = 2 on the FP8 target
    and FP8 head equals plain sampling of the FP8 target (600 samples each, chi-square p > 1e-3)."""
    plain = sample_counts(fp8_mtp3_ptd_dir, prompts[0][:24])
    spec = sample_counts(fp8_mtp3_ptd_dir, prompts[0][:24], mtp_mode="eagle_with_att", mtp_step=2)
    assert _chi2_homogeneity_p(plain, spec) > 1e-3
