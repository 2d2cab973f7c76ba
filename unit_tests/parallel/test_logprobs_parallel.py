"""Logprobs under pp (issue 32): the last stage computes them where the logits are and broadcasts them to the other
stages, so the driver (the first stage) delivers each token's logprob and top alternatives equal to one process's,
plain and with eagle k=2 (the verify rows' logprobs)."""

import pytest

from lightllm_mtp.sampling_params import SamplingParams
from unit_tests.parallel.workload import DENSE, PROMPTS, engine

PARAMS = [SamplingParams(temperature=0, max_new_tokens=10, logprobs=n) for n in (2, 0, None, 5, 1)]


def logprobs(eng) -> list:
    reqs = [eng.add_request(p, sp) for p, sp in zip(PROMPTS, PARAMS)]
    while eng.has_unfinished():
        eng.step_outputs()
    return [(list(r.output_ids), list(r.output_logprobs)) for r in reqs]


def close(a, b) -> bool:
    (ids_a, lp_a), (ids_b, lp_b) = a, b
    if ids_a != ids_b or len(lp_a) != len(lp_b):
        return False
    for (x, top_x), (y, top_y) in zip(lp_a, lp_b):
        if abs(x - y) > 1e-5 or [i for i, _ in top_x] != [i for i, _ in top_y]:
            return False
        if any(abs(u - v) > 1e-5 for (_, u), (_, v) in zip(top_x, top_y)):
            return False
    return True


@pytest.mark.parametrize("mtp", [{}, dict(mtp_mode="eagle_with_att", mtp_step=2)], ids=["plain", "eagle2"])
def test_logprobs_under_pp_equal_one_process(mtp):
    want = logprobs(engine(DENSE, mtp))
    assert [len(lp) for _, lp in want] == [10, 10, 0, 10, 10] and len(want[3][1][0][1]) == 5
    eng = engine(DENSE, mtp, pp=2)
    try:
        got = logprobs(eng)
    finally:
        eng.shutdown()
    assert all(close(a, b) for a, b in zip(got, want))
