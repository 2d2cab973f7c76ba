"""A request's end: the checked RequestStatus transitions, the order engine/request_end.py releases things in, and an
end under overlap that awaits its queued verify (AWAITING_VERIFY) while the prefix cache holds its last position."""

import pytest

from lightllm_mtp.common.radix_cache import key_elements
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.engine.request import EndState, Request, RequestStatus
from lightllm_mtp.engine.request_end import end_request, verify_arrived
from lightllm_mtp.sampling_params import SamplingParams

S = RequestStatus
ALLOWED = {(S.WAITING, S.RUNNING), (S.WAITING, S.FINISHED), (S.RUNNING, S.AWAITING_VERIFY), (S.RUNNING, S.FINISHED),
           (S.AWAITING_VERIFY, S.FINISHED)}  # fmt: skip


def request(status=S.WAITING) -> Request:
    req = Request(request_id=7, prompt_ids=[1, 2, 3], params=SamplingParams(max_new_tokens=4))
    req.status = status
    return req


@pytest.mark.parametrize("start", list(S))
def test_only_the_named_transitions_are_allowed(start):
    for to in S:
        req = request(start)
        if (start, to) in ALLOWED:
            req.advance(to)
            assert req.status is to
        else:
            with pytest.raises(RuntimeError, match=f"{start.value} -> {to.value} is not a transition"):
                req.advance(to)
            assert req.status is start
    assert request(start).ended == (start in (S.AWAITING_VERIFY, S.FINISHED))


class Recorder:
    """Stands in for the runner, the prefix cache and the scheduler, logging the calls request_end makes."""

    def __init__(self, awaiting: bool):
        self.calls, self.awaiting = [], awaiting

    def end_state(self, req):
        self.calls.append("runner.end_state")
        return EndState(committed=0, committed_row=0)

    def on_finish(self, req, end):
        self.calls.append(("cache.on_finish", req.status))
        return self.awaiting

    def release(self, req):
        self.calls.append(("runner.release", req.status))

    def finish(self, req):
        self.calls.append(("scheduler.finish", req.status))

    def after_queued_verify(self, req, emitted):
        self.calls.append(("cache.after_queued_verify", emitted))


@pytest.mark.parametrize("awaiting", [False, True])
def test_end_releases_cache_then_runner_then_scheduler(awaiting):
    log = Recorder(awaiting)
    req = request(S.RUNNING)
    end_request(req, log, log, log)
    assert log.calls == ["runner.end_state", ("cache.on_finish", S.RUNNING), ("runner.release", S.RUNNING),
                         ("scheduler.finish", S.RUNNING)]  # fmt: skip
    assert req.status is (S.AWAITING_VERIFY if awaiting else S.FINISHED)
    if awaiting:
        verify_arrived(req, [42], log)
        assert log.calls[-1] == ("cache.after_queued_verify", [42]) and req.status is S.FINISHED
    else:  # nothing awaits: a second delivery would be a bug
        with pytest.raises(RuntimeError, match="finished -> finished"):
            verify_arrived(req, [42], log)


def test_end_without_cache_or_scheduler():
    """A follower without the prefix cache: the runner's release only."""
    log = Recorder(awaiting=False)
    req = request(S.WAITING)
    end_request(req, log, None)
    assert log.calls == [("runner.release", S.WAITING)] and req.status is S.FINISHED


def test_abort_with_a_queued_verify_awaits_it_holding_its_end(tiny_dense_dir):
    """Eagle MTP under overlap with the prefix cache: a request aborted while its next verify is queued keeps its end
    node locked, the queued row's KV slot and a snapshot (AWAITING_VERIFY, no reservation left); the verify's first
    token then keys its newest position below that node, and nothing stays locked."""
    engine = LLMEngine(EngineArgs(model_dir=str(tiny_dense_dir), max_model_len=64, max_batch_size=4,
                                  mtp_mode="eagle_with_att", mtp_step=2))  # fmt: skip
    params = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)
    reqs = [engine.add_request(p, params) for p in ([5, 17, 300, 42, 9, 77], [900, 4, 4, 250], [31, 8, 222])]
    while engine._inflight is None or len(engine._inflight.reqs) < 3:
        engine.step_outputs()
    victim = reqs[1]
    engine.abort(victim)
    hold, tree = victim.cache_hold, engine.prefix_cache.tree
    assert victim.status is S.AWAITING_VERIFY and victim.req_idx is None and not victim.kv_slots
    assert hold.node is not None and hold.node.lock_ref > 0 and hold.queued_end is not None
    assert hold.node.depth == victim.num_tokens - 1 and victim not in engine.scheduler.running
    others = [r for r in reqs if r is not victim]
    assert engine.scheduler.reserved == sum(engine.scheduler.kv_need(len(r.prompt_ids), 16) - r.cache_hold.cached_len
                                            for r in others)  # fmt: skip
    end = hold.node
    tokens = victim.prompt_ids + victim.output_ids
    while engine.has_unfinished():
        engine.step_outputs()
    assert victim.status is S.FINISHED and hold.node is None and hold.queued_end is None
    assert tree.num_locked == 0 and engine.scheduler.reserved == 0
    assert tree.match(key_elements(tokens, end.depth, 1))[-1] is end  # its end is the tree's
    assert any(key[0] == tokens[-1] for key in end.children)  # its newest position, keyed with the verify's token
    tree.check()
