"""A seeded request samples the same tokens alone or inside any batch, with or without overlap scheduling, for a
given mtp_mode / mtp_step: its random numbers come from its own generator, and every verify step draws the same
amount from it (uniform blocks of k drafts), whatever the batch holds."""

import pytest

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.sampling_params import SamplingParams

SEEDED = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=18, seed=1234, ignore_eos=True)
PROMPT = [11, 22, 33, 44, 55, 66, 77]
NEIGHBOURS = [
    (list(range(5, 18)), SamplingParams(temperature=0.0, max_new_tokens=7, ignore_eos=True)),
    ([900, 901], SamplingParams(temperature=1.0, max_new_tokens=25, ignore_eos=True)),  # unseeded: default generator
    ([3, 1, 4, 1, 5], SamplingParams(temperature=0.7, max_new_tokens=12, seed=99, ignore_eos=True)),
    ([2] * 50, SamplingParams(temperature=0.0, max_new_tokens=30, ignore_eos=True)),  # ends at max_model_len
]
MODES = [{}, dict(mtp_mode="eagle_with_att", mtp_step=2), dict(mtp_mode="vanilla_with_att", mtp_step=2)]


def seeded_tokens(model_dir, neighbours, overlap, late_arrival=False, **mtp) -> list[int]:
    engine = LLMEngine(EngineArgs(model_dir=str(model_dir), max_model_len=64, max_batch_size=4, chunked_prefill_size=8,
                                  disable_overlap=not overlap, **mtp))
    others = [engine.add_request(p, sp) for p, sp in neighbours[:1]]
    if late_arrival:  # the seeded request joins while the others are mid-prompt / decoding
        engine.step_outputs()
        engine.step_outputs()
    req = engine.add_request(PROMPT, SEEDED)
    others += [engine.add_request(p, sp) for p, sp in neighbours[1:]]
    while engine.has_unfinished():
        engine.step_outputs()
    assert all(len(o.output_ids) == min(o.params.max_new_tokens, 64 - len(o.prompt_ids)) for o in others)
    return req.output_ids


@pytest.mark.parametrize("mtp", MODES, ids=["plain", "eagle", "vanilla"])
def test_seeded_request_is_independent_of_the_batch(tiny_dense_mtp3_dir, mtp):
    alone = seeded_tokens(tiny_dense_mtp3_dir, [], overlap=False, **mtp)
    assert len(alone) == SEEDED.max_new_tokens
    for overlap in (False, True):
        assert seeded_tokens(tiny_dense_mtp3_dir, [], overlap=overlap, **mtp) == alone
        assert seeded_tokens(tiny_dense_mtp3_dir, NEIGHBOURS, overlap=overlap, **mtp) == alone
        assert seeded_tokens(tiny_dense_mtp3_dir, NEIGHBOURS, overlap=overlap, late_arrival=True, **mtp) == alone
