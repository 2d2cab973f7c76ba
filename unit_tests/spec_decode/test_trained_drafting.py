"""The trained drafting fixture (fixtures/tiny_qwen3_5_mtp3_ptd_trained: 3 MTP modules and parallel-
drafting mask inputs on one target): greedy output equal to plain decoding for every mode, the multi-layer modules'
acceptance against eagle's reuse of module 0, and speculative sampling exact in every mode (a chi-square test of
homogeneity against plain sampling). Skipped while the fixture is not committed."""

import math

import pytest
import torch

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.tools.eval_acceptance import aggregate
from lightllm_mtp.tools.tiny_corpus import heldout_prompts, split_corpus

MODES = {
    "eagle": dict(mtp_mode="eagle_with_att"),
    "multi_layer": dict(mtp_mode="vanilla_with_att"),
    "ptd": dict(mtp_mode="eagle_with_att", parallel_drafting=True),
}
MAX_MODEL_LEN = 160


@pytest.fixture(scope="module")
def prompts(trained_mtp3_ptd_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained_mtp3_ptd_dir)
    return [ids for _, ids in heldout_prompts(tokenizer, split_corpus().heldout, 8, 96)]


def greedy(n):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


@pytest.mark.parametrize("mode, step", [("multi_layer", 3), ("ptd", 7), ("ptd", 3), ("eagle", 3)])
def test_trained_modes_greedy_equal_plain(trained_mtp3_ptd_dir, prompts, mode, step):
    lengths, max_new = [96, 41, 17, 70], [40, 23, 33, 12]
    cut = [p[:n] for p, n in zip(prompts, lengths)]
    params = [greedy(n) for n in max_new]
    plain = LLM(trained_mtp3_ptd_dir, max_model_len=MAX_MODEL_LEN).generate(cut, params)
    llm = LLM(trained_mtp3_ptd_dir, max_model_len=MAX_MODEL_LEN, mtp_step=step, chunked_prefill_size=32,
              **MODES[mode])  # fmt: skip
    outs = llm.generate(cut, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert all(len(o.spec.proposed_at) == step for o in outs)
    assert sum(o.spec.accepted_drafts for o in outs) > 0


def test_multi_layer_modules_beat_eagle_reuse_of_module_0(trained_mtp3_ptd_dir, prompts):
    """Held-out text, k = 3: modules 1 and 2 (trained for their offsets) are accepted more often at draft positions
    2 and 3 than module 0 run again (eagle), on the same target. PTD's tokens per step are reported beside."""
    stats = {}
    for mode in MODES:
        llm = LLM(trained_mtp3_ptd_dir, max_model_len=MAX_MODEL_LEN, mtp_step=3, **MODES[mode])
        stats[mode] = aggregate(llm.generate(prompts, greedy(48)))
    print({mode: (s["tokens_per_step"], s["acceptance_per_position"]) for mode, s in stats.items()})
    multi, eagle = stats["multi_layer"]["acceptance_per_position"], stats["eagle"]["acceptance_per_position"]
    assert multi[1] > eagle[1] and multi[2] > eagle[2], stats
    assert stats["ptd"]["tokens_per_step"] > 1.0


def _chi2_homogeneity_p(a: dict, b: dict) -> float:
    """p-value of a chi-square test that two samples (outcome -> count) come from one distribution; outcomes with
    fewer than 10 observations together are pooled."""
    keys = set(a) | set(b)
    big = [k for k in keys if a.get(k, 0) + b.get(k, 0) >= 10]
    rows = [[a.get(k, 0), b.get(k, 0)] for k in big]
    rest = [sum(a.get(k, 0) for k in keys - set(big)), sum(b.get(k, 0) for k in keys - set(big))]
    if sum(rest) >= 10:
        rows.append(rest)
    table = torch.tensor(rows, dtype=torch.float64)
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    chi2 = ((table - expected) ** 2 / expected).sum()
    dof = table.shape[0] - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), chi2 / 2))


SAMPLES = 600
SAMPLING = SamplingParams(temperature=1.0, top_k=3, max_new_tokens=3, ignore_eos=True)


def sample_counts(model_dir, prompt, **mtp) -> dict[tuple, int]:
    torch.manual_seed(0)
    llm = LLM(model_dir, max_model_len=64, max_batch_size=64, **mtp)
    out: dict[tuple, int] = {}
    for o in llm.generate([prompt] * SAMPLES, SAMPLING):
        out[tuple(o.token_ids)] = out.get(tuple(o.token_ids), 0) + 1
    return out


@pytest.fixture(scope="module")
def plain_samples(trained_mtp3_ptd_dir, prompts):
    return sample_counts(trained_mtp3_ptd_dir, prompts[0][:24])


@pytest.mark.parametrize("mode", list(MODES))
def test_speculative_sampling_is_exact(trained_mtp3_ptd_dir, prompts, plain_samples, mode):
    """Temperature 1, top-k 3: the joint distribution of the first three sampled tokens (27 outcomes) with k = 2
    drafts per step equals plain sampling's (600 samples each; p > 1e-3). A wrong rule fails by far: accepting every
    draft the target gives any probability scored p = 3e-59 with 1500 samples."""
    plain = plain_samples
    spec = sample_counts(trained_mtp3_ptd_dir, prompts[0][:24], mtp_step=2, **MODES[mode])
    p = _chi2_homogeneity_p(plain, spec)
    assert p > 1e-3, (p, sorted(plain.items(), key=lambda kv: -kv[1])[:6], sorted(spec.items(), key=lambda kv: -kv[1])[:6])
    assert math.isfinite(p)
