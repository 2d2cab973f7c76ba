"""Images under tp / pp (gloo, CPU processes): every rank runs its own copy of the vision tower on the images the
driver sends with a new request (base64 fp32 patches in the step ops, exact), so greedy tokens with images equal one
process's, plain and with eagle k=2 (prefix cache on: image keys by content on every rank)."""

import pytest

from lightllm_mtp.engine.parallel.step_ops import NewRequest, decode_ops, encode_ops, Launch
from lightllm_mtp.sampling_params import SamplingParams
from unit_tests.engine.test_images import prompt_of
from unit_tests.parallel.workload import engine
from unit_tests.vision_fixture import tiny_vision_checkpoint

GREEDY = SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True)


def tokens(eng, requests) -> list[list[int]]:
    reqs = [eng.add_request(ids, GREEDY, images=images) for ids, images in requests]
    while eng.has_unfinished():
        eng.step_outputs()
    return [list(r.output_ids) for r in reqs]


def test_images_travel_exactly_in_the_step_ops():
    model_dir = tiny_vision_checkpoint("qwen3_5")
    ids, images = prompt_of(model_dir, 2, seed=40)
    (op,) = decode_ops(encode_ops([Launch(1, None, [(7, 5)], [NewRequest(7, ids, GREEDY, None, tuple(images))])]))
    got = op.new_requests[0].images
    assert [(g.grid_thw, g.merge_size, g.content_hash) for g in got] == [
        (i.grid_thw, i.merge_size, i.content_hash) for i in images]  # fmt: skip
    assert all(g.pixel_values.equal(i.pixel_values) for g, i in zip(got, images))


@pytest.mark.parametrize("layout", [dict(tp=2), dict(pp=2)], ids=["tp2", "pp2"])
@pytest.mark.parametrize("mtp", [{}, dict(mtp_mode="eagle_with_att", mtp_step=2)], ids=["plain", "eagle2"])
def test_images_under_tp_and_pp_equal_one_process(layout, mtp):
    model_dir = tiny_vision_checkpoint("qwen3_5")
    requests = [prompt_of(model_dir, 1, seed=41), prompt_of(model_dir, 2, seed=42), ([11, 250, 31, 7, 9], [])]
    want = tokens(engine(model_dir, mtp, prefix_cache=True, chunked_prefill_size=16), requests)
    eng = engine(model_dir, mtp, prefix_cache=True, chunked_prefill_size=16, **layout)
    try:
        got = tokens(eng, requests)
    finally:
        eng.shutdown()
    assert got == want
