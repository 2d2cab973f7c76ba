"""Prefix cache hits past the original RoPE window (tiny model, YaRN factor 4 over 64 positions): a request resuming
from a cached prefix deeper than the window gives the uncached engine's tokens, plain and under MTP."""

import pytest

from lightllm_mtp import LLM, SamplingParams
from unit_tests.rope_fixtures import ORIGINAL_WINDOW, YARN_FACTOR

WINDOW = YARN_FACTOR * ORIGINAL_WINDOW
SHARED = [(37 * i + 11) % 1500 + 3 for i in range(170)]  # a long shared prefix, 2.6x the original window
PROMPTS = [SHARED + [5, 6, 7], SHARED + [900, 901], SHARED[:150] + [44, 45, 46]]
NEW = 40
MODES = {"plain": {}, "eagle": dict(mtp_mode="eagle_with_att", mtp_step=2)}


def run(model_dir, cache, mode):
    llm = LLM(model_dir, max_model_len=WINDOW, prefix_cache=cache, prefix_cache_interval=16, chunked_prefill_size=64,
              **MODES[mode])  # fmt: skip
    params = SamplingParams(temperature=0.0, max_new_tokens=NEW, ignore_eos=True)
    return [llm.generate([p], params)[0] for p in PROMPTS]  # one after the other: each later one hits the tree


@pytest.mark.parametrize("mode", list(MODES))
def test_resumed_output_past_the_window_equals_uncached(tiny_yarn_dir, mode):
    ref = run(tiny_yarn_dir, False, mode)
    outs = run(tiny_yarn_dir, True, mode)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    cached = [o.num_cached_tokens for o in outs]
    assert cached[0] == 0 and min(cached[1:]) > 2 * ORIGINAL_WINDOW
    assert cached[1] >= 160 and cached[2] >= 144
