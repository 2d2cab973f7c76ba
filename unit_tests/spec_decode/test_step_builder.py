"""Every verify step of every kind goes through the one device-side StepBuilder, and blocks near max_model_len keep
their k+1 rows with the rows past the draft count on the padding KV slot."""

import pytest
import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardMode
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.engine.step import HostCopy
from lightllm_mtp.sampling_params import SamplingParams
from lightllm_mtp.spec_decode.step_builder import StepBuilder

MAX_LEN = 40


def greedy(n):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


def mixed_workload(engine: LLMEngine) -> list:
    """Arrivals while others decode (verify steps beside prompt chunks), requests that hit max_model_len mid-block,
    others that end near max_new_tokens, one aborted with a step queued."""
    first = [engine.add_request([7, 8, 9, 10, 11, 12], greedy(30)), engine.add_request([3] * 33, greedy(30))]
    reqs, steps = list(first), 0
    while engine.has_unfinished():
        engine.step_outputs()
        steps += 1
        if steps == 2:
            reqs += [engine.add_request([5, 6, 7] * 4, greedy(9)), engine.add_request([4] * 30, greedy(20))]
        if steps == 4:
            reqs.append(engine.add_request([9, 9, 2, 1], greedy(11)))
        if steps == 6:
            engine.abort(reqs[2])
    return reqs


@pytest.mark.parametrize("mode", ["eagle_with_att", "vanilla_with_att"])
@pytest.mark.parametrize("overlap", [True, False])
def test_every_verify_step_comes_from_the_one_builder(monkeypatch, tiny_dense_mtp3_dir, mode, overlap):
    built, verified, host_reads_in_launch = set(), [], []
    real_verify_batch = StepBuilder.verify_batch

    def recording(self, b_req_idx, rows=None):
        batch, rows = real_verify_batch(self, b_req_idx, rows)
        built.add(id(batch))
        return batch, rows

    monkeypatch.setattr(StepBuilder, "verify_batch", recording)
    engine = LLMEngine(EngineArgs(model_dir=str(tiny_dense_mtp3_dir), max_model_len=MAX_LEN, max_batch_size=4,
                                  chunked_prefill_size=10, mtp_mode=mode, mtp_step=3, disable_overlap=not overlap))
    forward = engine.runner.runner.forward

    def checked_forward(batch):
        if batch.mode is ForwardMode.EXTEND:  # prompt chunks take the runner's forward too (its prefill graphs)
            return forward(batch)
        assert batch.mode is ForwardMode.VERIFY and id(batch) in built
        verified.append(batch.batch_size)
        return forward(batch)

    engine.runner.runner.forward = checked_forward
    inner = engine.runner.launch

    def no_reads(*args, **kwargs):  # no host read of a step's results while steps are being queued
        real = HostCopy.tolist
        HostCopy.tolist = lambda self: host_reads_in_launch.append(1) or real(self)
        try:
            return inner(*args, **kwargs)
        finally:
            HostCopy.tolist = real

    engine.runner.launch = no_reads
    reqs = mixed_workload(engine)
    assert verified and sum(verified) >= sum(r.spec_stats.verify_steps for r in reqs) > 0
    assert not host_reads_in_launch
    assert any(r.finish_reason.value == "length" and r.num_tokens == MAX_LEN for r in reqs)
    u = engine.usage()
    assert (u.kv_used, u.kv_reserved, u.req_slots_used) == (0, 0, 0)


def test_mixed_workload_tokens_equal_plain_decoding(tiny_dense_mtp3_dir):
    def outputs(**mtp):
        e = LLMEngine(EngineArgs(model_dir=str(tiny_dense_mtp3_dir), max_model_len=MAX_LEN, max_batch_size=4,
                                 chunked_prefill_size=10, **mtp))
        reqs = mixed_workload(e)  # the aborted request (index 2) stops at a step-dependent point: its reason only
        return [r.finish_reason if i == 2 else (r.output_ids, r.finish_reason) for i, r in enumerate(reqs)]

    plain = outputs()
    for mode in ("eagle_with_att", "vanilla_with_att"):
        for k in (1, 3):
            assert outputs(mtp_mode=mode, mtp_step=k) == plain, (mode, k)


@pytest.mark.parametrize("mode", ["eagle_with_att", "vanilla_with_att", "ptd"])
def test_padding_rows_near_max_model_len_touch_only_the_padding_slot(monkeypatch, tiny_dense_mtp3_dir, mode):
    batches, windows = [], []
    real = StepBuilder.verify_batch
    real_window = StepBuilder.draft_window

    def recording_window(self, *args, **kwargs):
        batch, hidden, w = real_window(self, *args, **kwargs)
        windows.append((batch.positions.clone(), batch.mem_index.clone(), self.hold_slot))
        return batch, hidden, w

    def recording(self, b_req_idx, rows=None):
        batch, state_rows = real(self, b_req_idx, rows)
        num_drafts = self.state.num_drafts[b_req_idx.long()].clone()
        batches.append((batch, num_drafts, self.hold_slot))
        return batch, state_rows

    monkeypatch.setattr(StepBuilder, "verify_batch", recording)
    monkeypatch.setattr(StepBuilder, "draft_window", recording_window)
    spec = dict(mtp_mode="eagle_with_att", parallel_drafting=True) if mode == "ptd" else dict(mtp_mode=mode)
    engine = LLMEngine(EngineArgs(model_dir=str(tiny_dense_mtp3_dir), max_model_len=24, max_batch_size=4,
                                  mtp_step=3, **spec))  # fmt: skip
    reqs = [engine.add_request(p, greedy(100)) for p in ([3] * 17, [4] * 19, [5] * 22)]
    while engine.has_unfinished():
        engine.step_outputs()
    assert [len(r.output_ids) for r in reqs] == [7, 5, 2]
    padded = 0
    for batch, num_drafts, hold in batches:
        q = 4
        rows = torch.arange(batch.num_tokens) % q
        padding = rows > num_drafts.repeat_interleave(q)
        assert (batch.mem_index[padding] == hold).all()
        assert (batch.mem_index[~padding] != hold).all()
        assert (batch.mem_index[batch.positions >= 24] == hold).all()
        assert (batch.positions[~padding] < 24 - 1).all()  # a real row's emitted token lands below max_model_len
        padded += int(padding.sum())
    assert padded > 0
    for positions, mem, hold in windows:  # draft passes: no real row at or past the last position
        assert (positions[mem != hold] < 24 - 1).all() and (mem[positions >= 24 - 1] == hold).all()
    assert windows
    table = engine.model.caches.req_manager.req_to_token
    assert table.shape[1] == 24 + 2 * 3
    assert ((table[:, 24:] == 0) | (table[:, 24:] == engine.model.caches.kv_pool.hold_slot)).all()
