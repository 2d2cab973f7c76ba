import pytest

from lightllm_mtp.engine.request import Request
from lightllm_mtp.engine.scheduler import Scheduler
from lightllm_mtp.sampling_params import SamplingParams


def req(i, prompt_len, max_new=4):
    return Request(request_id=i, prompt_ids=list(range(1, prompt_len + 1)), params=SamplingParams(max_new_tokens=max_new))


def advance(scheduled):
    for s in scheduled:
        s.request.num_computed += s.num_new_tokens
        if not s.request.in_prefill and s.request.num_computed == s.request.num_tokens:
            s.request.output_ids.append(0)


def test_chunked_prefill_splits_prompt_under_budget():
    s = Scheduler(max_batch_size=4, token_budget=5, kv_capacity=100, max_model_len=50)
    r = req(0, 12)
    s.add(r)
    chunks = []
    while r.in_prefill:
        step = s.schedule()
        chunks.append([(x.request.request_id, x.num_new_tokens) for x in step])
        advance(step)
    assert chunks == [[(0, 5)], [(0, 5)], [(0, 2)]]


def test_decode_rows_first_then_prompt_chunks():
    s = Scheduler(max_batch_size=4, token_budget=4, kv_capacity=100, max_model_len=50)
    a, b = req(0, 2), req(1, 9)
    s.add(a)
    advance(s.schedule())  # a prefilled
    s.add(b)
    step = s.schedule()
    assert [(x.request.request_id, x.num_new_tokens) for x in step] == [(0, 1), (1, 3)]


def test_admission_respects_slots_and_kv_reservation():
    s = Scheduler(max_batch_size=2, token_budget=100, kv_capacity=20, max_model_len=50)
    for i in range(3):
        s.add(req(i, 6, max_new=4))  # each reserves 10
    ids = [x.request.request_id for x in s.schedule()]
    assert ids == [0, 1] and s.reserved == 20 and len(s.waiting) == 1
    s.finish(s.running[0])
    assert s.reserved == 10
    assert [x.request.request_id for x in s.schedule()][-1] == 2


def test_request_larger_than_pool_is_rejected():
    s = Scheduler(max_batch_size=2, token_budget=100, kv_capacity=8, max_model_len=50)
    with pytest.raises(ValueError, match="needs 10 KV slots"):
        s.add(req(0, 6, max_new=4))
