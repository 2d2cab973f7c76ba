"""RoPE scaling end to end: logits of the tiny model with YaRN / linear / llama3 over a 64-position native window
equal HF transformers' uncached forward at every position up to 4x that window, and greedy decoding past the window
equals HF's (fp32, CPU)."""

import dataclasses

import pytest
import torch

from lightllm_mtp import LLM, SamplingParams
from unit_tests.hf_reference import hf_greedy, hf_prefill_logits
from unit_tests.rope_fixtures import ORIGINAL_WINDOW, YARN, YARN_FACTOR, with_rope

ATOL = 1e-4
WINDOW = YARN_FACTOR * ORIGINAL_WINDOW  # 256 positions
PROMPT = [(37 * i + 11) % 1500 + 3 for i in range(WINDOW - 1)]  # positions 0..254
SCALINGS = {
    "yarn": YARN,
    "linear": {"rope_type": "linear", "factor": YARN_FACTOR, "rope_theta": 1e4},
    "llama3": {"rope_type": "llama3", "factor": YARN_FACTOR, "original_max_position_embeddings": ORIGINAL_WINDOW,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0, "rope_theta": 1e4},
}


@pytest.fixture(scope="module", params=list(SCALINGS))
def scaled_dir(request, tmp_path_factory, tiny_dense_dir, tiny_yarn_dir):
    if request.param == "yarn":
        return tiny_yarn_dir
    return with_rope(tiny_dense_dir, tmp_path_factory.mktemp(request.param) / "ckpt", SCALINGS[request.param])


@pytest.fixture(scope="module")
def unscaled_dir(tmp_path_factory, tiny_dense_dir):
    """The same weights and rope_theta without scaling: what a model ignoring the scaling fields would compute."""
    return with_rope(tiny_dense_dir, tmp_path_factory.mktemp("unscaled") / "ckpt",
                     {"rope_type": "default", "rope_theta": 1e4}, max_position_embeddings=WINDOW)  # fmt: skip


def prefill_logits(model_dir, prompt):
    """Our logits at every prompt position, one uncached prefill forward."""
    llm = LLM(model_dir, dtype="float32", max_model_len=WINDOW, chunked_prefill_size=WINDOW)
    engine = llm.engine
    req = engine.add_request(prompt, SamplingParams(temperature=0.0))
    scheduled = engine.scheduler.schedule()
    assert [s.num_new_tokens for s in scheduled] == [len(prompt)]
    batch, _ = engine.runner.build_batch(scheduled)
    batch = dataclasses.replace(batch, b_logits_index=torch.arange(batch.num_tokens))
    with torch.inference_mode():
        logits = engine.model.forward(batch).logits
    engine.abort(req)
    return logits


def test_logits_match_hf_up_to_4x_the_original_window(scaled_dir, unscaled_dir):
    ours = prefill_logits(scaled_dir, PROMPT)
    ref = hf_prefill_logits(scaled_dir, PROMPT)
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)
    # the scaling matters: ignoring it (plain RoPE, same theta) gives other logits, most of all past the window
    plain = hf_prefill_logits(unscaled_dir, PROMPT)
    assert (plain[ORIGINAL_WINDOW:] - ref[ORIGINAL_WINDOW:]).abs().max() > 100 * ATOL


def test_greedy_decode_past_the_window_matches_hf(tiny_yarn_dir):
    prompt = PROMPT[: 3 * ORIGINAL_WINDOW]
    steps = WINDOW - len(prompt) - 1
    llm = LLM(tiny_yarn_dir, dtype="float32", max_model_len=WINDOW, chunked_prefill_size=50)
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=steps, ignore_eos=True))[0]
    ref_tokens, _ = hf_greedy(tiny_yarn_dir, prompt, steps)
    assert out.token_ids == ref_tokens
