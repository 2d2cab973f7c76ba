"""Penalties, a bias and min_tokens under tp / pp (issue 32): every rank processes its logits from its own request
mirrors (their committed output), so the tokens equal one process's, with eagle k=2 as without MTP."""

import pytest

from lightllm_mtp.sampling_params import SamplingParams
from unit_tests.parallel.workload import DENSE, PROMPTS, engine

PARAMS = [SamplingParams(temperature=0, max_new_tokens=14, repetition_penalty=1.3, frequency_penalty=0.4,
                         presence_penalty=0.3, logit_bias={198: -5.0}, min_tokens=6, stop_token_ids=[25])
          for _ in PROMPTS]  # fmt: skip
EAGLE = dict(mtp_mode="eagle_with_att", mtp_step=2)


def tokens(eng) -> list[list[int]]:
    reqs = [eng.add_request(p, sp) for p, sp in zip(PROMPTS, PARAMS)]
    while eng.has_unfinished():
        eng.step_outputs()
    return [list(r.output_ids) for r in reqs]


@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2)])
def test_penalised_tokens_identical_to_one_process(tp, pp):
    want = tokens(engine(DENSE, EAGLE))
    eng = engine(DENSE, EAGLE, tp=tp, pp=pp)
    try:
        assert tokens(eng) == want
    finally:
        eng.shutdown()
