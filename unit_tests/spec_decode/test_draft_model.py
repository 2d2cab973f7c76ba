"""External draft model (`mtp_mode=draft_model`) and PARD (`parallel_drafting`): greedy output token-identical to
plain decoding (dense and MoE targets, k = 1..5, mixed batches, chunked prefill, stops, aborts, near max_model_len),
the draft's own state (GDN conv window and SSM row at its committed position, KV) equal to a from-scratch pass
over the committed tokens after rollback, and speculative sampling exact."""

import pytest
import torch

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode
from lightllm_mtp.tools.make_tiny_checkpoint import build_tiny_checkpoint
from unit_tests.spec_decode.draft_model_fixtures import near_copy
from unit_tests.spec_decode.test_trained_drafting import _chi2_homogeneity_p

PROMPTS = [[5, 17, 300, 42, 9, 77, 1024, 3, 58, 600, 11, 12, 13], [900, 4, 4, 250], [31, 8, 222, 1500, 64, 2, 7]]
MAX_NEW = [23, 9, 16]


def greedy(n, stops=()):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True, stop_token_ids=list(stops))


def draft_kwargs(draft_dir, k, pard=False, **kw):
    return dict(mtp_mode="draft_model", mtp_step=k, mtp_draft_model_dir=draft_dir, parallel_drafting=pard, **kw)


@pytest.fixture(scope="module")
def targets(tiny_dense_dir, tiny_moe_dir):
    return {"dense": tiny_dense_dir, "moe": tiny_moe_dir}


@pytest.fixture(scope="module")
def near_drafts(targets, tmp_path_factory):
    """Per target a near copy declaring a PARD mask token (the last, padding id)."""
    out = {}
    for name, target in targets.items():
        vocab = LLM(target, max_model_len=8).engine.model_config.vocab_size
        out[name] = near_copy(target, tmp_path_factory.mktemp(f"near_{name}"), pard_token=vocab - 1)
    return out


@pytest.fixture(scope="module")
def small_draft(tmp_path_factory):
    """A smaller random dense draft (3 GDN + 1 attention layers, hidden 32) with the tiny targets' tokenizer."""
    return build_tiny_checkpoint("qwen3_5", tmp_path_factory.mktemp("small_draft"), mtp_layers=0, seed=3, draft=True,
                                 pard=True)  # fmt: skip


@pytest.fixture(scope="module")
def references(targets):
    return {name: [o.token_ids for o in LLM(t, max_model_len=64).generate(PROMPTS, [greedy(n) for n in MAX_NEW])]
            for name, t in targets.items()}  # fmt: skip


@pytest.mark.parametrize("target", ["dense", "moe"])
@pytest.mark.parametrize("pard", [False, True], ids=["autoregressive", "pard"])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_greedy_equals_plain_decoding(targets, near_drafts, references, target, pard, k):
    llm = LLM(targets[target], max_model_len=64, chunked_prefill_size=5,
              **draft_kwargs(near_drafts[target], k, pard))  # fmt: skip
    outs = llm.generate(PROMPTS, [greedy(n) for n in MAX_NEW])
    assert [o.token_ids for o in outs] == references[target]
    assert all(len(o.spec.proposed_at) == k for o in outs)
    assert sum(o.spec.accepted_drafts_per_step * o.spec.verify_steps for o in outs) > 0  # rollback exercised
    pool = llm.engine.model.caches.kv_pool
    llm.engine.evict_prefix_cache()  # the prefix cache (on) keeps the finished prompts' KV
    assert pool.num_free == pool.size


@pytest.mark.parametrize("pard", [False, True], ids=["autoregressive", "pard"])
def test_small_draft_for_moe_target(targets, small_draft, references, pard):
    """A smaller dense draft (other sizes, other layer counts) for the MoE target."""
    llm = LLM(targets["moe"], max_model_len=64, chunked_prefill_size=7, **draft_kwargs(small_draft, 3, pard))
    assert [o.token_ids for o in llm.generate(PROMPTS, [greedy(n) for n in MAX_NEW])] == references["moe"]


@pytest.mark.parametrize("pard", [False, True], ids=["autoregressive", "pard"])
def test_late_arrivals_reuse_slots(targets, near_drafts, references, pard):
    """Two request slots for three requests: the third is prefilled (in 3-token chunks) beside verify steps, in
    the slot (and draft GDN state slot) a finished request left."""
    llm = LLM(targets["dense"], max_model_len=64, max_batch_size=2, chunked_prefill_size=3,
              **draft_kwargs(near_drafts["dense"], 3, pard))  # fmt: skip
    assert [o.token_ids for o in llm.generate(PROMPTS, [greedy(n) for n in MAX_NEW])] == references["dense"]


def test_target_as_its_own_draft_accepts_every_draft(targets):
    """The target drafting for itself: every draft is accepted, so every chain step continued the exact state."""
    for k in (2, 4):
        llm = LLM(targets["dense"], max_model_len=64, **draft_kwargs(targets["dense"], k))
        outs = llm.generate(PROMPTS, greedy(4 * (k + 1) + 1))
        assert all(o.spec.accepted_drafts_per_step == k for o in outs)


def test_stops_and_max_model_len(targets, near_drafts, references):
    plain = LLM(targets["dense"], max_model_len=24)
    stop = references["dense"][0][7]
    params = [greedy(40, [stop]), greedy(40), greedy(40)]  # a stop token; the others end at max_model_len
    expect = [o.token_ids for o in plain.generate(PROMPTS, params)]
    assert expect[0][-1] == stop and len(expect[1]) == 24 - len(PROMPTS[1])
    for pard in (False, True):
        llm = LLM(targets["dense"], max_model_len=24, **draft_kwargs(near_drafts["dense"], 4, pard))
        outs = llm.generate(PROMPTS, params)
        assert [o.token_ids for o in outs] == expect
        assert [o.finish_reason for o in outs] == ["stop", "length", "length"]


def test_abort_frees_everything_and_others_continue(targets, near_drafts, references):
    llm = LLM(targets["dense"], max_model_len=64, **draft_kwargs(near_drafts["dense"], 3))
    engine = llm.engine
    reqs = [engine.add_request(p, greedy(n)) for p, n in zip(PROMPTS, MAX_NEW)]
    for _ in range(3):
        engine.step_outputs()
    engine.abort(reqs[1])
    while engine.has_unfinished():
        engine.step_outputs()
    assert reqs[0].output_ids == references["dense"][0] and reqs[2].output_ids == references["dense"][2]
    pool, slots = engine.model.caches.kv_pool, engine.model.caches.req_manager
    engine.evict_prefix_cache()
    assert pool.num_free == pool.size and slots.num_free == slots.max_reqs


def _recompute(draft, pool, tokens):
    """The draft's KV (every layer, positions 0..n-1) and final GDN state (conv window, SSM) of a fresh prefill.
    pool: the target's KV pool, whose allocator hands out the slots of both."""
    caches, dev = draft.caches, draft.rt.device
    n = len(tokens)
    req = draft.rt.max_reqs  # the padding request slot: free in a test that is not replaying graphs
    host_slots = pool.alloc(n)
    slots = host_slots.to(dev)
    table = caches.req_manager.req_to_token
    saved = table[req, :n].clone()
    table[req, :n] = slots
    batch = ForwardBatch(
        mode=ForwardMode.EXTEND, input_ids=torch.tensor(tokens, device=dev), positions=torch.arange(n, device=dev),
        mem_index=slots, b_req_idx=torch.tensor([req], dtype=torch.int32, device=dev),
        b_seq_len=torch.tensor([n], dtype=torch.int32, device=dev),
        b1_cu_q_len=torch.tensor([0, n], dtype=torch.int32, device=dev),
        b_has_initial_state=torch.tensor([False], device=dev), b_logits_index=torch.tensor([n - 1], device=dev),
        max_q_len=n,
    )  # fmt: skip
    draft.forward(batch)
    table[req, :n] = saved
    state = caches.req_manager.linear_state
    k_conv = draft.cfg.linear_conv_kernel_dim
    rows = state.rows_per_req
    kv = caches.kv_pool.k_buffer[:, slots.long()].clone(), caches.kv_pool.v_buffer[:, slots.long()].clone()
    pool.free(host_slots)
    return kv, state.conv[:, req, :, : k_conv - 1].clone(), state.ssm[:, req * rows].clone()


@pytest.mark.parametrize("pard", [False, True], ids=["autoregressive", "pard"])
def test_draft_state_after_rollback_equals_recompute(targets, near_drafts, pard):
    """After verify steps with all, some and no drafts accepted, the draft's committed GDN state (conv window at
    column accept - 1, SSM row accept - 1) and its KV at every committed position equal a fresh prefill of the
    draft over the committed tokens x_0..x_N (N the newest token, which the draft window has just read)."""
    k = 3
    llm = LLM(targets["dense"], max_model_len=64, max_total_token_num=400, disable_overlap=True,
              **draft_kwargs(near_drafts["dense"], k, pard))  # fmt: skip
    engine, proposer = llm.engine, llm.engine.runner.proposer
    draft, state = proposer.draft, engine.runner.state
    reqs = [engine.add_request(p, greedy(40)) for p in PROMPTS]
    accepts, checked = set(), 0
    for _ in range(8):
        engine.step_outputs()
        for r in reqs:
            if r.req_idx is None or r.in_prefill:
                continue
            tokens = r.prompt_ids + r.output_ids
            accept = int(state.accept_len[r.req_idx])
            assert int(state.start[r.req_idx]) == len(tokens) - 1
            accepts.add(accept)
            (k_ref, v_ref), conv_ref, ssm_ref = _recompute(draft, engine.model.caches.kv_pool, tokens)
            lin = draft.caches.req_manager.linear_state
            k_conv = draft.cfg.linear_conv_kernel_dim
            conv = lin.conv[:, r.req_idx, :, accept - 1 : accept - 1 + k_conv - 1]
            ssm = lin.ssm[:, r.req_idx * lin.rows_per_req + accept - 1]
            torch.testing.assert_close(conv, conv_ref, atol=2e-5, rtol=0)
            torch.testing.assert_close(ssm, ssm_ref, atol=2e-5, rtol=1e-4)
            live = draft.caches.req_manager.req_to_token[r.req_idx, : len(tokens)].long()
            torch.testing.assert_close(draft.caches.kv_pool.k_buffer[:, live], k_ref, atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(draft.caches.kv_pool.v_buffer[:, live], v_ref, atol=2e-5, rtol=1e-4)
            checked += 1
    assert checked >= 10 and 1 in accepts and len(accepts) >= (2 if pard else 3), (checked, accepts)


SAMPLES = 400
SAMPLING = SamplingParams(temperature=1.0, top_k=3, max_new_tokens=3, ignore_eos=True)


def _sample_counts(model_dir, **kw) -> dict[tuple, int]:
    torch.manual_seed(0)
    llm = LLM(model_dir, max_model_len=64, max_batch_size=64, **kw)
    out: dict[tuple, int] = {}
    for o in llm.generate([PROMPTS[0]] * SAMPLES, SAMPLING):
        out[tuple(o.token_ids)] = out.get(tuple(o.token_ids), 0) + 1
    return out


def test_speculative_sampling_is_exact(targets, near_drafts):
    """Temperature 1, top-k 3: the joint distribution of the first three sampled tokens with k = 2 drafts per step
    (autoregressive and PARD) equals plain sampling's (chi-square homogeneity, p > 1e-3)."""
    plain = _sample_counts(targets["dense"])
    for pard in (False, True):
        spec = _sample_counts(targets["dense"], **draft_kwargs(near_drafts["dense"], 2, pard))
        assert _chi2_homogeneity_p(plain, spec) > 1e-3, (pard, plain, spec)


@pytest.mark.parametrize("pard", [False, True], ids=["autoregressive", "pard"])
def test_reduced_draft_vocabulary(targets, near_drafts, references, tmp_path, pard):
    """The draft model's logits over a subset of ids (its lm_head rows gathered): greedy stays exact, every draft
    is in the subset."""
    import json

    vocab = LLM(targets["dense"], max_model_len=8).engine.model_config.vocab_size
    ids = sorted({t for ref in references["dense"] for t in ref} | set(range(0, vocab, 7)))
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps({"token_ids": ids, "vocab_size": vocab}))
    llm = LLM(targets["dense"], max_model_len=64, mtp_draft_vocab_file=path,
              **draft_kwargs(near_drafts["dense"], 3, pard))  # fmt: skip
    assert [o.token_ids for o in llm.generate(PROMPTS, [greedy(n) for n in MAX_NEW])] == references["dense"]
    drafts = llm.engine.runner.state.drafts
    assert set(drafts.flatten().tolist()) <= set(ids) | {0}
