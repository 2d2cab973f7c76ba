"""Overlap scheduling: the next step queued before the current one's tokens are read gives the same tokens as the
synchronous loop, wastes nothing it does not free, and really runs ahead in steady decode."""


import pytest
import torch

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.engine.request import RequestStatus
from lightllm_mtp.sampling_params import SamplingParams

PROMPTS = [[5, 17, 300, 42, 9, 77, 1024, 3, 58, 600, 11], [900, 4, 4, 250], [31, 8, 222, 1500, 64, 2, 7], [3, 3]]
MTP = [{}, dict(mtp_mode="eagle_with_att", mtp_step=1), dict(mtp_mode="eagle_with_att", mtp_step=3)]
MTP_IDS = ["plain", "eagle_k1", "eagle_k3"]


def make_engine(model_dir, overlap: bool, **kwargs) -> LLMEngine:
    kwargs.setdefault("max_model_len", 64)
    kwargs.setdefault("max_batch_size", 4)
    return LLMEngine(EngineArgs(model_dir=str(model_dir), disable_overlap=not overlap, **kwargs))


def count_launch_ahead(engine: LLMEngine) -> list[int]:
    calls = [0]
    inner = engine.runner.launch

    def counted(scheduled, after=None):
        calls[0] += after is not None
        return inner(scheduled, after)

    engine.runner.launch = counted
    return calls


def run(engine: LLMEngine, prompts, params) -> list:
    reqs = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    while engine.has_unfinished():
        engine.step_outputs()
    return reqs


def assert_idle(engine: LLMEngine) -> None:
    if engine.prefix_cache is not None:
        engine.prefix_cache.tree.check()
    u = engine.usage()
    assert (u.kv_used, u.kv_reserved, u.req_slots_used, u.running, u.waiting) == (0, 0, 0, 0, 0)


@pytest.mark.parametrize("mtp", MTP, ids=MTP_IDS)
@pytest.mark.parametrize("chunked_prefill_size", [4096, 5])
def test_overlap_gives_the_tokens_of_the_synchronous_loop(tiny_dense_dir, mtp, chunked_prefill_size):
    """Mixed lengths, requests finishing at different steps (length, a stop token, eos off), one seeded sampling
    request: every output and finish reason equals the synchronous loop's, and all slots are free afterwards."""
    base = make_engine(tiny_dense_dir, overlap=False, chunked_prefill_size=chunked_prefill_size, **mtp)
    greedy = [SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True) for n in (12, 5, 20, 9)]
    probe = run(base, PROMPTS, greedy)
    stop = probe[2].output_ids[6]  # request 2 stops at its 7th token (or earlier, where that token repeats)
    params = list(greedy)
    params[2] = SamplingParams(temperature=0.0, max_new_tokens=20, stop_token_ids=[stop])
    params[3] = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=15, seed=7, ignore_eos=True)
    expected = run(base, PROMPTS, params)
    assert expected[2].finish_reason.value == "stop" and len(expected[2].output_ids) <= 7

    engine = make_engine(tiny_dense_dir, overlap=True, chunked_prefill_size=chunked_prefill_size, **mtp)
    ahead = count_launch_ahead(engine)
    got = run(engine, PROMPTS, params)
    assert [r.output_ids for r in got] == [r.output_ids for r in expected]
    assert [r.finish_reason for r in got] == [r.finish_reason for r in expected]
    assert [r.spec_stats for r in got] == [r.spec_stats for r in expected]  # the same drafts, accepted alike
    assert ahead[0] > 0
    assert_idle(engine)


@pytest.mark.parametrize("k", [1, 3])
def test_overlap_on_the_trained_checkpoint_drafts_alike(trained_dense_dir, k):
    """Real acceptance (long accepted blocks): verify steps built on the device propose exactly the drafts the host
    path proposes, so tokens and per-position acceptance match the synchronous loop."""
    params = SamplingParams(temperature=0.0, max_new_tokens=40)
    prompts = [[int(t) for t in range(40, 40 + n)] for n in (30, 12, 21)]
    expected = run(make_engine(trained_dense_dir, overlap=False, mtp_mode="eagle_with_att", mtp_step=k), prompts,
                   [params] * 3)  # fmt: skip
    engine = make_engine(trained_dense_dir, overlap=True, mtp_mode="eagle_with_att", mtp_step=k)
    ahead = count_launch_ahead(engine)
    got = run(engine, prompts, [params] * 3)
    assert [r.output_ids for r in got] == [r.output_ids for r in expected]
    assert [r.spec_stats for r in got] == [r.spec_stats for r in expected]
    assert sum(r.spec_stats.accepted_drafts for r in got) > 0 and ahead[0] > 0
    assert_idle(engine)


@pytest.mark.parametrize("mtp", MTP, ids=MTP_IDS)
def test_steady_decode_runs_ahead_every_step(tiny_dense_dir, mtp):
    """A batch decoding far from its limits queues each next step before reading the current one."""
    engine = make_engine(tiny_dense_dir, overlap=True, **mtp)
    ahead = count_launch_ahead(engine)
    params = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)
    reqs = [engine.add_request(p, params) for p in PROMPTS[:2]]
    steps = 0
    while engine.has_unfinished():
        engine.step_outputs()
        steps += 1
    k = mtp.get("mtp_step", 0)
    # all but the prefill step, the step that queues nothing (nothing is queued yet) and the last (k + 2) steps
    # near max_new_tokens, where a request may or may not finish by length
    assert ahead[0] >= steps - 2 - (k + 2)
    assert all(len(r.output_ids) == 24 for r in reqs)
    assert_idle(engine)


@pytest.mark.parametrize("mtp", MTP, ids=MTP_IDS)
def test_abort_with_a_queued_step(tiny_dense_dir, mtp):
    """Aborting a request whose next step is already queued frees its slots; the others are unaffected."""
    engine = make_engine(tiny_dense_dir, overlap=True, **mtp)
    params = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)
    reqs = [engine.add_request(p, params) for p in PROMPTS[:3]]
    for _ in range(8):
        engine.step_outputs()
        if engine._inflight is not None and len(engine._inflight.reqs) == 3:
            break
    assert engine._inflight is not None and len(engine._inflight.reqs) == 3
    engine.abort(reqs[1])
    assert reqs[1].ended and reqs[1].req_idx is None and not reqs[1].kv_slots
    # MTP: the prefix cache keeps the queued verify's row of its newest token until that verify's token arrives
    awaiting = RequestStatus.AWAITING_VERIFY if mtp else RequestStatus.FINISHED
    assert reqs[1].status is awaiting
    n_before = len(reqs[1].output_ids)
    while engine.has_unfinished():
        engine.step_outputs()
    assert len(reqs[1].output_ids) == n_before and reqs[1].status is RequestStatus.FINISHED
    base = make_engine(tiny_dense_dir, overlap=False, **mtp)
    expected = run(base, [PROMPTS[0], PROMPTS[2]], [params] * 2)
    assert [reqs[0].output_ids, reqs[2].output_ids] == [r.output_ids for r in expected]
    assert_idle(engine)
    for r in reqs:  # the last queued step is dropped once its requests are gone
        engine.abort(r)
    assert engine._inflight is None


def emulate_graph_output_buffers(monkeypatch) -> list[int]:
    """On CPU, make every uniform-layout forward behave like a CUDA-graph replay: its logits and hidden are views of
    one static buffer per (forward function, mode, rows per request) that the next call of that layout overwrites.
    Code that reads a forward's output after the same layout ran again (e.g. a queued step's draft pass) would then
    see the newer values, as on the GPU."""
    from lightllm_mtp.common.basemodel.forward_batch import ModelOutput
    from lightllm_mtp.common.basemodel.cuda_graph import GraphedForward

    buffers: dict = {}
    calls = [0]
    inner = GraphedForward.forward

    def replay_like(self, batch, *hidden):
        out = inner(self, batch, *hidden)
        uniform = batch.num_tokens == batch.batch_size * batch.max_q_len == batch.b_logits_index.shape[0]
        if not uniform:
            return out
        key = (id(self), batch.mode, batch.max_q_len)
        static = buffers.get(key)
        if static is None or static.logits.shape[0] < out.logits.shape[0]:
            static = buffers[key] = ModelOutput(
                logits=torch.empty(64 * batch.max_q_len, out.logits.shape[1]),
                hidden=torch.empty(64 * batch.max_q_len, out.hidden.shape[1]),
            )
        n = out.logits.shape[0]
        static.logits[:n].copy_(out.logits)
        static.hidden[:n].copy_(out.hidden)
        calls[0] += 1
        return ModelOutput(logits=static.logits[:n], hidden=static.hidden[:n])

    monkeypatch.setattr(GraphedForward, "forward", replay_like)
    return calls


@pytest.mark.parametrize("k", [1, 3])
def test_overlap_reads_no_output_a_later_graph_replay_overwrote(monkeypatch, trained_dense_dir, k):
    """With graph-like static outputs, overlap scheduling still drafts exactly as the synchronous loop does."""
    calls = emulate_graph_output_buffers(monkeypatch)
    params = SamplingParams(temperature=0.0, max_new_tokens=30)
    prompts = [[int(t) for t in range(50, 50 + n)] for n in (17, 9, 25)]
    mtp = dict(mtp_mode="eagle_with_att", mtp_step=k)
    expected = run(make_engine(trained_dense_dir, overlap=False, **mtp), prompts, [params] * 3)
    engine = make_engine(trained_dense_dir, overlap=True, **mtp)
    ahead = count_launch_ahead(engine)
    got = run(engine, prompts, [params] * 3)
    assert [r.output_ids for r in got] == [r.output_ids for r in expected]
    assert [r.spec_stats for r in got] == [r.spec_stats for r in expected]
    assert ahead[0] > 0 and calls[0] > 0


DRAFTING = {"multi_layer": dict(mtp_mode="vanilla_with_att"),
            "ptd": dict(mtp_mode="eagle_with_att", parallel_drafting=True)}  # fmt: skip


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("mode", list(DRAFTING))
def test_multi_layer_and_ptd_overlap_drafts_alike(trained_mtp3_ptd_dir, mode, k):
    """Multi-layer MTP (a module per draft position) and parallel drafting on the trained fixture: with overlap the
    next blocks' drafts equal the synchronous loop's, token for token and acceptance for acceptance."""
    params = [SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True) for n in (30, 14, 25, 9)]
    prompts = [[int(t) for t in range(60, 60 + n)] for n in (21, 8, 15, 30)]
    mtp = dict(mtp_step=k, max_model_len=96, **DRAFTING[mode])
    expected = run(make_engine(trained_mtp3_ptd_dir, overlap=False, **mtp), prompts, params)
    engine = make_engine(trained_mtp3_ptd_dir, overlap=True, **mtp)
    ahead = count_launch_ahead(engine)
    got = run(engine, prompts, params)
    assert [r.output_ids for r in got] == [r.output_ids for r in expected]
    assert [r.spec_stats for r in got] == [r.spec_stats for r in expected]
    assert ahead[0] > 0 and sum(r.spec_stats.accepted_at[0] for r in got) > 0
    assert_idle(engine)


@pytest.mark.parametrize("mode", list(DRAFTING))
def test_stop_token_and_abort_while_a_step_is_queued(trained_mtp3_ptd_dir, mode):
    """A request that stops (or is aborted) while its next verify step is queued leaves a dead row in that step; the
    draft passes of that step must still cover every row of the batch (multi-layer MTP, parallel drafting)."""
    mtp = dict(mtp_step=3, max_model_len=96, **DRAFTING[mode])
    prompts = [[int(t) for t in range(60, 60 + n)] for n in (21, 8, 13)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=30, ignore_eos=True)
    probe = run(make_engine(trained_mtp3_ptd_dir, overlap=False, **mtp), prompts, [greedy] * 3)
    params = [greedy, SamplingParams(temperature=0.0, max_new_tokens=30, stop_token_ids=[probe[1].output_ids[8]]),
              greedy]  # fmt: skip
    expected = run(make_engine(trained_mtp3_ptd_dir, overlap=False, **mtp), prompts, params)
    engine = make_engine(trained_mtp3_ptd_dir, overlap=True, **mtp)
    got = run(engine, prompts, params)
    assert [r.output_ids for r in got] == [r.output_ids for r in expected]
    assert [r.spec_stats for r in got] == [r.spec_stats for r in expected]
    assert_idle(engine)

    reqs = [engine.add_request(p, greedy) for p in prompts]
    for _ in range(3):
        engine.step_outputs()
    assert engine._inflight is not None and len(engine._inflight.reqs) == 3
    engine.abort(reqs[1])
    while engine.has_unfinished():
        engine.step_outputs()
    assert [reqs[0].output_ids, reqs[2].output_ids] == [probe[0].output_ids, probe[2].output_ids]
    assert_idle(engine)


@pytest.mark.parametrize("mtp", MTP, ids=MTP_IDS)
def test_steps_with_prompt_chunks_are_queued_ahead_too(tiny_dense_dir, mtp):
    """Arrivals while others decode: steps carrying prompt chunks are queued before the step ahead of them is read
    (every step kind overlaps), with the synchronous loop's tokens."""

    def run_with_arrivals(engine):
        params = SamplingParams(temperature=0.0, max_new_tokens=14, ignore_eos=True)
        reqs, steps = [engine.add_request(PROMPTS[0], params)], 0
        while engine.has_unfinished():
            engine.step_outputs()
            steps += 1
            if steps in (2, 3, 5):
                reqs.append(engine.add_request(PROMPTS[steps % 4], params))
        return reqs

    expected = run_with_arrivals(make_engine(tiny_dense_dir, overlap=False, chunked_prefill_size=6, **mtp))
    engine = make_engine(tiny_dense_dir, overlap=True, chunked_prefill_size=6, **mtp)
    chunk_steps_ahead = [0]
    inner = engine.runner.launch

    def counted(scheduled, after=None):
        chunk_steps_ahead[0] += after is not None and any(s.request.in_prefill for s in scheduled)
        return inner(scheduled, after)

    engine.runner.launch = counted
    got = run_with_arrivals(engine)
    assert [r.output_ids for r in got] == [r.output_ids for r in expected]
    assert [r.spec_stats for r in got] == [r.spec_stats for r in expected]
    assert chunk_steps_ahead[0] > 0
    assert_idle(engine)
