"""The model worker loop in-process (plain queues, one thread): token deltas, aborts, rejected requests, a
failing step, and pool usage back to idle."""

import queue
import threading

import pytest

from lightllm_mtp import LLM
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.sampling_params import SamplingParams
from lightllm_mtp.server.messages import AbortRequest, AddRequest, Shutdown, WorkerOutput, WorkerReady
from lightllm_mtp.server.model_worker import ModelWorker

PROMPTS = [[5, 17, 300, 42, 9], [900, 4, 4, 250], [31, 8, 222, 1500, 64, 2, 7]]


def greedy(n):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


@pytest.fixture
def worker(tiny_dense_dir):
    args = EngineArgs(model_dir=str(tiny_dense_dir), max_model_len=64, max_batch_size=2, mtp_mode="eagle_with_att",
                      mtp_step=2)  # fmt: skip
    inbox, outbox = queue.Queue(), queue.Queue()
    w = ModelWorker(0, args, 1, inbox, outbox)
    ready = outbox.get_nowait()
    assert isinstance(ready, WorkerReady) and ready.mtp_step == 2 and ready.max_model_len == 64
    # one budget of 2 x 64 KV slots' bytes: the prefix cache's snapshots take their share of it (auto: between 0.1 and
    # 0.5), the KV pool keeps at least one max-length request
    assert 64 <= ready.stats.kv_capacity <= int(128 * 0.9) and ready.stats.req_slots_capacity == 2
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    yield w
    inbox.put(Shutdown())
    thread.join(timeout=30)
    assert not thread.is_alive()


def run_until(w, rids, on_output=lambda out, tokens: None, timeout=60):
    """Collects deltas until every rid has its last one: {rid: (token ids, finish reason, last delta)}."""
    tokens, last, stats = {r: [] for r in rids}, {}, None
    while len(last) < len(rids):
        out = w.outbox.get(timeout=timeout)
        assert isinstance(out, WorkerOutput)
        stats = out.stats
        for d in out.deltas:
            tokens[d.rid] += d.token_ids
            if d.finish_reason is not None:
                assert d.rid not in last
                last[d.rid] = d
        on_output(out, tokens)
    return tokens, last, stats


def test_deltas_match_offline_generation_and_abort_frees_slots(worker, tiny_dense_dir):
    expect = LLM(tiny_dense_dir, max_model_len=64, max_batch_size=2).generate(PROMPTS[:2], [greedy(6), greedy(9)])
    worker.inbox.put(AddRequest(10, PROMPTS[0], greedy(6)))
    worker.inbox.put(AddRequest(11, PROMPTS[1], greedy(9)))
    worker.inbox.put(AddRequest(12, PROMPTS[2], greedy(40)))  # waits for a request slot, then is aborted
    worker.inbox.put(AddRequest(13, [1] * 64, greedy(4)))  # prompt too long: rejected, the worker goes on
    sent = []

    def abort_when_started(out, tokens):
        if tokens[12] and not sent:
            sent.append(worker.inbox.put(AbortRequest(12)))

    tokens, last, stats = run_until(worker, [10, 11, 12, 13], abort_when_started)
    assert [tokens[10], tokens[11]] == [o.token_ids for o in expect]
    assert (last[10].finish_reason, last[11].finish_reason, last[12].finish_reason) == ("length", "length", "abort")
    assert 0 < len(tokens[12]) < 40
    assert last[13].finish_reason == "error" and "max_model_len is 64" in last[13].error
    assert last[10].spec.verify_steps >= 1 and len(last[10].spec.proposed_at) == 2
    assert (stats.kv_used, stats.kv_reserved, stats.req_slots_used, stats.running, stats.waiting) == (0, 0, 0, 0, 0)
    assert stats.finished_requests == 4 and stats.generated_tokens == 6 + 9 + len(tokens[12])
    assert stats.spec.verify_steps == sum(last[r].spec.verify_steps for r in (10, 11, 12))


def test_a_failing_step_fails_its_requests_and_the_worker_goes_on(worker, monkeypatch):
    real = worker.engine.step_outputs
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected step failure")
        return real()

    monkeypatch.setattr(worker.engine, "step_outputs", flaky)
    worker.inbox.put(AddRequest(1, PROMPTS[0], greedy(20)))
    worker.inbox.put(AddRequest(2, PROMPTS[1], greedy(20)))
    tokens, last, stats = run_until(worker, [1, 2])
    assert {d.finish_reason for d in last.values()} == {"error"}
    assert "injected step failure" in last[1].error
    assert stats.kv_used == 0 and stats.req_slots_used == 0
    worker.inbox.put(AddRequest(3, PROMPTS[2], greedy(3)))
    tokens, last, stats = run_until(worker, [3])
    assert last[3].finish_reason == "length" and len(tokens[3]) == 3


def test_a_grammar_that_does_not_compile_ends_its_request_with_the_reason(worker, monkeypatch):
    """The background compilation's error reaches the front as the request's last delta; the other request runs."""
    from lightllm_mtp.sampling.grammar_compiler import GrammarCompiler
    from lightllm_mtp.sampling_params import StructuredOutput

    def broken(self, so):
        raise ValueError("injected compile failure")

    monkeypatch.setattr(GrammarCompiler, "_compile", broken)
    structured = SamplingParams(temperature=0.0, max_new_tokens=5, structured=StructuredOutput("regex", "[0-9]+"))
    worker.inbox.put(AddRequest(1, PROMPTS[0], structured))
    worker.inbox.put(AddRequest(2, PROMPTS[1], greedy(4)))
    tokens, last, stats = run_until(worker, [1, 2])
    assert last[1].finish_reason == "error" and "injected compile failure" in last[1].error and not tokens[1]
    assert last[2].finish_reason == "length" and len(tokens[2]) == 4
    assert stats.kv_used == 0 and stats.req_slots_used == 0 and stats.waiting == 0


def test_a_busy_worker_reports_even_in_steps_without_tokens(tiny_dense_dir, monkeypatch):
    """Issue 35 item 1: the front's watchdog takes a replica silent with work for dead, so a busy worker sends its
    stats at least every HEARTBEAT_S, also between prompt chunks that yield no token."""
    from lightllm_mtp.server import model_worker

    monkeypatch.setattr(model_worker, "HEARTBEAT_S", 0.0)
    args = EngineArgs(model_dir=str(tiny_dense_dir), max_model_len=64, max_batch_size=1, chunked_prefill_size=4)
    inbox, outbox = queue.Queue(), queue.Queue()
    w = ModelWorker(0, args, 1, inbox, outbox)
    outbox.get_nowait()  # WorkerReady
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    try:
        inbox.put(AddRequest(1, list(range(5, 61)), greedy(2)))  # 14 prompt chunks (2 a step), then 2 tokens
        outputs = []
        while not any(d.finish_reason for out in outputs for d in out.deltas):
            outputs.append(outbox.get(timeout=60))
        silent_steps = [out for out in outputs if not out.deltas and out.stats.running]
        assert len(silent_steps) >= 5, [len(o.deltas) for o in outputs]
    finally:
        inbox.put(Shutdown())
        thread.join(timeout=30)
