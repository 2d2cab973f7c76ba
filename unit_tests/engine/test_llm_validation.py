"""LLM.generate checks every request before it queues any: a bad one in a batch leaves the engine untouched."""

import pytest

from lightllm_mtp import LLM, SamplingParams


@pytest.mark.parametrize("mtp", [{}, dict(mtp_mode="eagle_with_att", mtp_step=2)], ids=["plain", "mtp"])
def test_a_rejected_request_leaves_nothing_queued(tiny_dense_dir, mtp):
    llm = LLM(tiny_dense_dir, max_model_len=32, max_batch_size=2, max_total_token_num=30, **mtp)
    fine = SamplingParams(temperature=0.0, max_new_tokens=4)
    with pytest.raises(ValueError, match="KV slots"):  # the pool holds 30 tokens; this one may need 32 + lookahead
        llm.generate([[1, 2, 3], [4, 5, 6] * 9], [fine, SamplingParams(temperature=0.0, max_new_tokens=20)])
    with pytest.raises(ValueError, match="out of range"):
        llm.generate([[1, 2, 3], [10**9]], fine)
    engine = llm.engine
    assert not engine.has_unfinished() and not engine.scheduler.waiting
    out = llm.generate([[1, 2, 3]], fine)  # still serves
    assert len(out[0].token_ids) == 4


@pytest.mark.parametrize("seed", [2**64, 2**63, -(2**63) - 1, True, 1.5])
def test_seed_must_fit_in_64_bits(seed):
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=seed)


def test_extreme_seeds_that_fit_are_accepted(tiny_dense_dir):
    llm = LLM(tiny_dense_dir, max_model_len=32)
    params = [SamplingParams(temperature=1.0, max_new_tokens=3, seed=s) for s in (2**63 - 1, -(2**63), 0)]
    outs = llm.generate([[1, 2, 3]] * 3, params)
    assert all(len(o.token_ids) == 3 for o in outs)


@pytest.mark.parametrize("mtp", [{}, dict(mtp_mode="eagle_with_att", mtp_step=2)], ids=["plain", "mtp"])
@pytest.mark.parametrize("prefix_cache", [True, False], ids=["cache", "no_cache"])
def test_the_default_pool_admits_every_request_max_model_len_allows(tiny_dense_dir, mtp, prefix_cache):
    """Issue 35 item 10: one request slot and the default pool; admission reserves the lookahead slots on top of
    min(prompt + max_new_tokens, max_model_len), so the default pool must hold them too."""
    llm = LLM(tiny_dense_dir, max_model_len=64, max_batch_size=1, prefix_cache=prefix_cache, **mtp)
    prompt = list(range(5, 15))
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=64 - len(prompt), ignore_eos=True))
    assert len(out[0].token_ids) == 64 - len(prompt) and out[0].finish_reason == "length"
