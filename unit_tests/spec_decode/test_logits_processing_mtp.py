"""Issue 32 item 2 on the trained fixtures: penalties, logit_bias, min_tokens and min_p go through one logits-processing
seam (lightllm_mtp/sampling/) at every place that chooses a token, so greedy MTP output (eagle, multi-layer, parallel
drafting, a draft model) equals plain decoding token for token under each; logprobs of MTP runs equal plain runs'."""

import dataclasses

import pytest

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.tools.tiny_corpus import heldout_prompts, split_corpus

MAX_MODEL_LEN = 128
MODES = {
    "eagle2": dict(mtp_mode="eagle_with_att", mtp_step=2),
    "multi_layer3": dict(mtp_mode="vanilla_with_att", mtp_step=3),
    "ptd3": dict(mtp_mode="eagle_with_att", mtp_step=3, parallel_drafting=True),
}
FEATURES = {
    "repetition": dict(repetition_penalty=1.4),
    "presence": dict(presence_penalty=1.5),
    "frequency": dict(frequency_penalty=0.7),
    "all_penalties": dict(repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.4),
}


@pytest.fixture(scope="module")
def prompts(trained_mtp3_ptd_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained_mtp3_ptd_dir)
    return [ids for _, ids in heldout_prompts(tokenizer, split_corpus().heldout, 3, 48)]


@pytest.fixture(scope="module")
def plain(trained_mtp3_ptd_dir):
    return LLM(trained_mtp3_ptd_dir, max_model_len=MAX_MODEL_LEN)


@pytest.fixture(scope="module", params=list(MODES))
def mtp(request, trained_mtp3_ptd_dir):
    return LLM(trained_mtp3_ptd_dir, max_model_len=MAX_MODEL_LEN, chunked_prefill_size=32, **MODES[request.param])


def greedy(n, **kw):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True, **kw)


@pytest.mark.parametrize("feature", list(FEATURES))
def test_penalties_mtp_greedy_equals_plain(plain, mtp, prompts, feature):
    params = [greedy(n, **FEATURES[feature]) for n in (30, 17, 24)]
    expect = [o.token_ids for o in plain.generate(prompts, params)]
    unpenalised = [o.token_ids for o in plain.generate(prompts, [greedy(n) for n in (30, 17, 24)])]
    assert expect != unpenalised, "the penalty changed nothing: the test would prove nothing"
    outs = mtp.generate(prompts, params)
    assert [o.token_ids for o in outs] == expect
    assert sum(o.spec.accepted_drafts for o in outs) > 0


def test_logit_bias_and_min_tokens_mtp_greedy_equals_plain(plain, mtp, prompts):
    base = [o.token_ids for o in plain.generate(prompts, [greedy(20)] * 3)]
    favoured, banned = base[0][3], base[1][2]
    biased = greedy(20, logit_bias={favoured: 2.5, banned: -100})
    expect = [o.token_ids for o in plain.generate(prompts, [biased] * 3)]
    assert expect != base and all(banned not in ids for ids in expect)
    assert [o.token_ids for o in mtp.generate(prompts, [biased] * 3)] == expect
    stop = base[2][4]  # emitted at position 4 without min_tokens: held back until 12 tokens
    held = SamplingParams(temperature=0.0, max_new_tokens=20, stop_token_ids=[stop], min_tokens=12)
    out = plain.generate(prompts[2:], held)[0].token_ids
    assert stop not in out[:12] and len(out) >= 12
    assert mtp.generate(prompts[2:], held)[0].token_ids == out


def test_draft_model_greedy_equals_plain_with_penalties(trained_dense_dir, trained_draft_dir, prompts):
    params = [greedy(n, repetition_penalty=1.3, frequency_penalty=0.3) for n in (24, 12, 18)]
    expect = [o.token_ids for o in LLM(trained_dense_dir, max_model_len=MAX_MODEL_LEN).generate(prompts, params)]
    llm = LLM(trained_dense_dir, max_model_len=MAX_MODEL_LEN, mtp_mode="draft_model", mtp_step=2,
              mtp_draft_model_dir=str(trained_draft_dir))  # fmt: skip
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == expect
    assert sum(o.spec.accepted_drafts for o in outs) > 0


@pytest.mark.parametrize("mode", list(MODES))
def test_logprobs_of_mtp_equal_plain(plain, trained_mtp3_ptd_dir, prompts, mode):
    """fp32 on CPU: the logprob of a token emitted from an accepted draft is its verify row's, within 1e-5 (the
    prompt prefilled as the plain run does: a different chunking moves the state by ~1e-5 by itself)."""
    params = greedy(16, logprobs=3)
    ref = plain.generate(prompts, params)
    outs = LLM(trained_mtp3_ptd_dir, max_model_len=MAX_MODEL_LEN, **MODES[mode]).generate(prompts, params)
    for r, o in zip(ref, outs):
        assert o.token_ids == r.token_ids and len(o.logprobs) == len(o.token_ids)
        for (lp, top), (rlp, rtop) in zip(o.logprobs, r.logprobs):
            assert abs(lp - rlp) < 1e-5 and [t for t, _ in top] == [t for t, _ in rtop]
            assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(top, rtop)), (top, rtop)
        assert all(top[0][0] == t and abs(top[0][1] - lp) < 1e-6 for t, (lp, top) in zip(o.token_ids, o.logprobs))


def test_min_p_keeps_greedy_and_narrows_sampling(plain, prompts):
    assert [o.token_ids for o in plain.generate(prompts, greedy(8, min_p=0.5))] == [
        o.token_ids for o in plain.generate(prompts, greedy(8))
    ]
    sampled = SamplingParams(temperature=1.0, max_new_tokens=8, ignore_eos=True, seed=1, min_p=1.0, logprobs=1)
    out = plain.generate(prompts[:1], sampled)[0]  # min_p 1: only the most likely token survives
    assert all(t == top[0][0] for t, (_, top) in zip(out.token_ids, out.logprobs))
    assert dataclasses.replace(sampled, min_p=0.0).min_p == 0.0


PENALISED = dict(temperature=1.0, top_k=3, max_new_tokens=3, ignore_eos=True, repetition_penalty=1.5,
                 presence_penalty=1.0, logit_bias={11: 1.0})  # fmt: skip


def _counts(model_dir, prompt, params, samples=600, **mtp) -> dict[tuple, int]:
    import torch

    torch.manual_seed(0)
    out: dict[tuple, int] = {}
    for o in LLM(model_dir, max_model_len=64, max_batch_size=64, **mtp).generate([prompt] * samples, params):
        out[tuple(o.token_ids)] = out.get(tuple(o.token_ids), 0) + 1
    return out


@pytest.mark.parametrize("mode", ["eagle2", pytest.param("multi_layer3", marks=pytest.mark.slow),
                                  pytest.param("ptd3", marks=pytest.mark.slow)])  # fmt: skip
def test_speculative_sampling_with_penalties_is_exact(trained_mtp3_ptd_dir, prompts, mode):
    """Temperature 1, top-k 3, penalties and a bias: the joint distribution of the first three tokens under MTP equals
    plain sampling's (chi-square homogeneity, p > 1e-3), and differs from the unpenalised one (p < 1e-3)."""
    from unit_tests.spec_decode.test_trained_drafting import _chi2_homogeneity_p

    prompt = prompts[0][:24]
    plain = _counts(trained_mtp3_ptd_dir, prompt, SamplingParams(**PENALISED))
    spec = _counts(trained_mtp3_ptd_dir, prompt, SamplingParams(**PENALISED), **MODES[mode])
    assert _chi2_homogeneity_p(plain, spec) > 1e-3, (plain, spec)
    free = {k: v for k, v in PENALISED.items() if k not in ("repetition_penalty", "presence_penalty", "logit_bias")}
    assert _chi2_homogeneity_p(plain, _counts(trained_mtp3_ptd_dir, prompt, SamplingParams(**free))) < 1e-3
