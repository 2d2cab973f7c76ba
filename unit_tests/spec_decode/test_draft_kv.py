"""Draft-KV consistency: after verify steps with all, some or no drafts accepted, every MTP module's cached KV at
every committed position whose inputs are all committed equals a from-scratch pass over the committed sequence.

Module m's row at position p reads the token at p + m + 1, so with the newest token at N its rows p <= N - m - 1
are fully committed (the later ones are provisional and recomputed by the next draft window). The recompute runs
the target over x_0..x_{N-1} in a fresh engine, then module 0 on (target hidden, x_{p+1}), module m on (module
m-1's hidden, x_{p+m+1}): the training convention. fp32; tolerance 2e-5 plus 4x the largest difference between the
target's own KV written by the verify steps and by the recompute's prefill (CPU: ~1e-6; the GPU's chunked GDN
prefill rounds otherwise)."""

import dataclasses

import pytest
import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.engine.request import RequestStatus
from lightllm_mtp import LLM, SamplingParams
from unit_tests.spec_decode.oracle_drafts import oracle_drafts

PROMPTS = [[5, 17, 300, 42, 9, 77, 1024, 3, 58, 600, 11, 12, 13], [900, 4], [31, 8, 222, 1500, 64, 2, 7]]
MODES = {
    "multi_layer": dict(mtp_mode="vanilla_with_att", mtp_step=3),
    "eagle": dict(mtp_mode="eagle_with_att", mtp_step=3),
    "ptd": dict(mtp_mode="eagle_with_att", mtp_step=3, parallel_drafting=True),
}


def greedy(n):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


def recompute(engine: LLMEngine, tokens: list[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each module's (k, v) at positions 0..N-1 from scratch, N = len(tokens) - 1, and the slots there."""
    model, caches, dev = engine.model, engine.model.caches, engine.args.device
    n = len(tokens) - 1
    req = caches.req_manager.alloc()
    slots = caches.kv_pool.alloc(n).to(dev)
    caches.req_manager.req_to_token[req, :n] = slots
    batch = ForwardBatch(
        mode=ForwardMode.EXTEND,
        input_ids=torch.tensor(tokens[:n], device=dev),
        positions=torch.arange(n, device=dev),
        mem_index=slots,
        b_req_idx=torch.tensor([req], dtype=torch.int32, device=dev),
        b_seq_len=torch.tensor([n], dtype=torch.int32, device=dev),
        b1_cu_q_len=torch.tensor([0, n], dtype=torch.int32, device=dev),
        b_has_initial_state=torch.tensor([False], device=dev),
        b_logits_index=torch.arange(n, device=dev),
        max_q_len=n,
        keep_all_hidden=True,
    )
    hidden = model.forward(batch).hidden
    first_kv = len(model.cfg.full_attention_layers)
    kv = []
    for m, module in enumerate(engine.runner.proposer.modules):
        ids = torch.tensor([tokens[p + m + 1] if p + m + 1 <= n else 0 for p in range(n)], device=dev)
        hidden = module.fn(dataclasses.replace(batch, input_ids=ids), hidden).hidden
        k, v = caches.kv_pool.layer(first_kv + m)
        kv.append(torch.stack([k[slots.long()], v[slots.long()]]))
    return kv, slots.long()


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("corrupt_every", [1000, 3, 1], ids=["all_accepted", "some_accepted", "none_accepted"])
def test_draft_kv_equals_recompute(monkeypatch, tiny_dense_mtp3_dir, mode, corrupt_every):
    check_draft_kv(monkeypatch, tiny_dense_mtp3_dir, mode, corrupt_every, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(MODES))
def test_draft_kv_equals_recompute_gpu(monkeypatch, tiny_dense_mtp3_dir, mode):
    """The same on the GPU path (Triton draft-window kernel, CUDA graphs of the draft passes), fp32."""
    check_draft_kv(monkeypatch, tiny_dense_mtp3_dir, mode, 3, "cuda", dtype="float32", graph_max_batch_size=8)


def check_draft_kv(monkeypatch, model_dir, mode, corrupt_every, device, **engine):
    reference = [o.token_ids for o in LLM(model_dir, max_model_len=96).generate(PROMPTS, greedy(60))]
    oracle_drafts(monkeypatch, reference, corrupt_every)
    args = dict(model_dir=model_dir, max_model_len=96, chunked_prefill_size=12, disable_overlap=True, device=device,
                **engine, **MODES[mode])  # fmt: skip
    engine = LLMEngine(EngineArgs(**args))
    reqs = [engine.add_request(p, greedy(60)) for p in PROMPTS]
    for _ in range(12):
        engine.step()
    assert all(r.output_ids and r.status is not RequestStatus.FINISHED for r in reqs)
    fresh = LLMEngine(EngineArgs(**args))
    caches = engine.model.caches
    first_kv = len(engine.model.cfg.full_attention_layers)
    checked = 0
    for r in reqs:
        tokens = r.prompt_ids + r.output_ids
        assert r.output_ids == reference[r.request_id][: len(r.output_ids)]
        newest = len(tokens) - 1
        want, fresh_slots = recompute(fresh, tokens)
        # the target's own KV over the same positions (verify steps vs one prefill) sets the numerical scale: the
        # GPU's chunked GDN prefill and its verify kernels round differently, the CPU's agree to ~1e-6
        live_slots = caches.req_manager.req_to_token[r.req_idx, :newest].long()
        target_diff = max(
            (caches.kv_pool.k_buffer[layer][live_slots] - fresh.model.caches.kv_pool.k_buffer[layer][fresh_slots])
            .abs().max().item()
            for layer in range(first_kv)
        )
        tol = 2e-5 + 4 * target_diff
        for m, expected in enumerate(want):
            n = newest - m  # positions 0..N-m-1 are fully committed for module m
            slots = live_slots[:n]
            k, v = caches.kv_pool.layer(first_kv + m)
            got = torch.stack([k[slots], v[slots]])
            diff = (got - expected[:, :n]).abs()
            where = f"module {m}, request {r.request_id}, {len(r.output_ids)} tokens out, target KV diff {target_diff:.3g}"
            torch.testing.assert_close(got, expected[:, :n], rtol=0, atol=tol, msg=lambda text: f"{where}: "
                                       f"max |diff| {diff.max():.3g}, {text}")  # fmt: skip
            checked += n
    assert checked > 0
