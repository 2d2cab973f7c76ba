"""MTP acceptance on held-out text (64 prompts of 96 tokens, 48 greedy tokens each) with the published -FP8 layout
(FP8 target and FP8 MTP heads) against the 16-bit checkpoint: FP8 loses at most 0.03 at every draft position, k=1..3.

Measured on 2 CPU cores (acceptance at draft positions 1..k, bf16 -> FP8):
  dense eagle     k=1 0.691 -> 0.679; k=2 0.669/0.407 -> 0.663/0.399; k=3 0.653/0.390/0.269 -> 0.642/0.387/0.258
  MoE eagle       k=1 0.729 -> 0.734; k=2 0.710/0.470 -> 0.728/0.495; k=3 0.693/0.450/0.279 -> 0.719/0.479/0.315
  multi-layer     k=1 0.692 -> 0.674; k=2 0.663/0.492 -> 0.639/0.473; k=3 0.654/0.477/0.389 -> 0.640/0.476/0.390
(dense and MoE with bf16 scales, multi-layer with fp32 scales: the fixtures of conftest.py). The largest difference
is the MoE's +0.036 at k=3 position 3 (FP8 better, within noise: ~1200 verify steps give a standard error of ~0.013
per position); the largest FP8 loss is 0.025 (multi-layer k=2, position 1). (With 16 prompts the dense k=1 gap read
-0.049: prompt sampling noise, gone at 64.) The whole grid is slow; the default run keeps the dense k=1..2 cases."""

import pytest

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.tools.eval_acceptance import aggregate
from lightllm_mtp.tools.tiny_corpus import heldout_prompts, split_corpus

MAX_DROP = 0.03
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=48, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(trained_dense_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained_dense_dir)
    return [ids for _, ids in heldout_prompts(tokenizer, split_corpus().heldout, 64, 96)]


def acceptance(model_dir, prompts, mode, k) -> list[float]:
    llm = LLM(str(model_dir), max_model_len=160, max_batch_size=64, mtp_mode=mode, mtp_step=k)
    return aggregate(llm.generate(prompts, GREEDY))["acceptance_per_position"]


def _check(bf16_dir, fp8_dir, prompts, mode, k):
    bf16, fp8 = acceptance(bf16_dir, prompts, mode, k), acceptance(fp8_dir, prompts, mode, k)
    print(f"{mode} k={k}: bf16 {bf16} fp8 {fp8}")
    assert all(f >= b - MAX_DROP for b, f in zip(bf16, fp8)), (bf16, fp8)
    assert min(fp8) > 0.2  # a dropped scale would sink it near 0


@pytest.mark.parametrize("k", [1, 2])
def test_dense_fp8_acceptance_within_003(trained_dense_dir, fp8_dense_dir, prompts, k):
    _check(trained_dense_dir, fp8_dense_dir, prompts, "eagle_with_att", k)


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("which", ["dense_k3", "moe", "multi_layer"])
def test_fp8_acceptance_within_003_grid(request, prompts, which, k):
    if which == "dense_k3" and k != 3:
        pytest.skip("dense k=1, 2 run in the default suite")
    names = {"dense_k3": ("trained_dense_dir", "fp8_dense_dir", "eagle_with_att"),
             "moe": ("trained_moe_dir", "fp8_moe_dir", "eagle_with_att"),
             "multi_layer": ("trained_mtp3_ptd_dir", "fp8_mtp3_ptd_dir", "vanilla_with_att")}  # fmt: skip
    bf16_name, fp8_name, mode = names[which]
    _check(request.getfixturevalue(bf16_name), request.getfixturevalue(fp8_name), prompts, mode, k)
