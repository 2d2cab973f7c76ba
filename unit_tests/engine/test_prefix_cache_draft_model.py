"""Prefix cache with an external draft model (mtp_mode draft_model, autoregressive and PARD; trained tiny target and
drafts): greedy output and per-position acceptance identical with and without the cache (acceptance is where a
wrong draft state would show), hits, the draft's half of each snapshot, its KV in the tree's slots and its state after
a hit equal to a from-scratch pass of the draft, one budget, the host tier, and every slot accounted for."""

from types import SimpleNamespace

import pytest
import torch

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.common.radix_cache import key_elements
from lightllm_mtp.common.state_snapshots import StateSnapshotPool
from lightllm_mtp.engine.runner_factory import draft_snapshot_pool
from lightllm_mtp.spec_decode import draft_model_proposer
from unit_tests.engine.test_prefix_cache import INTERVAL, SYSTEM, check_accounting
from unit_tests.engine.test_prefix_cache import rounds as prefix_cache_rounds
from unit_tests.spec_decode.test_draft_model import _recompute
from unit_tests.trained_fixtures import DENSE as TARGET
from unit_tests.trained_fixtures import DRAFT, PARD_DRAFT

DRAFTS = {False: DRAFT, True: PARD_DRAFT}
K = 2
ATOL = dict(atol=2e-5, rtol=1e-4)  # window / verify rows vs a prefill: fp32 rounding of differently shaped GEMMs


def greedy(n=6):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


def build(cache, pard, **kw):
    kw.setdefault("max_total_token_num", 32 * 8 * 96)  # ~115 snapshots: none evicted in these workloads
    kw.setdefault("prefix_cache_state_share", 0.9)
    kw.setdefault("chunked_prefill_size", 16)
    return LLM(TARGET, max_model_len=96, prefix_cache=cache, prefix_cache_interval=INTERVAL,
               mtp_mode="draft_model", mtp_step=K, mtp_draft_model_dir=DRAFTS[pard], parallel_drafting=pard,
               **kw)  # fmt: skip


def rounds(first_output):
    """test_prefix_cache's batches (a cold request, concurrent questions on the system prompt, a branch at every
    offset of a snapshot interval, a multi-turn resend), then the first chat's prompt + 1..k+1 new tokens."""
    q1 = SYSTEM + [11, 12, 13, 14]
    return prefix_cache_rounds(first_output) + [[q1 + [50 + i for i in range(j)] for j in range(1, K + 2)]]


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "sync"])
@pytest.mark.parametrize("pard", [False, True], ids=["draft_model", "pard"])
def test_outputs_and_acceptance_identical_with_the_cache(pard, overlap):
    ref_llm = build(False, pard, disable_overlap=not overlap)
    first = ref_llm.generate([SYSTEM + [11, 12, 13, 14]], greedy())[0].token_ids
    batches = rounds(first)
    ref = [o for b in batches for o in ref_llm.generate(b, greedy())]
    llm = build(True, pard, disable_overlap=not overlap)
    assert llm.engine.prefix_cache.lookahead == 0  # the draft's KV at p depends on tokens 0..p only
    outs = [o for b in batches for o in llm.generate(b, greedy())]
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert [o.spec for o in outs] == [o.spec for o in ref]  # drafts accepted per position, per request
    assert sum(o.spec.accepted_drafts_per_step for o in outs) > 0
    cached = [o.num_cached_tokens for o in outs]
    q1 = len(batches[0][0])
    assert cached[0] == 0 and min(cached[1:11]) >= 2 * INTERVAL
    assert min(cached[11:15]) >= q1  # the resend: at least the first chat's prompt end, and with new tokens its end
    # (partial end snapshots too: the draft catches up), so j new tokens leave at most j + 1 uncached
    assert all(len(o.prompt_token_ids) - c <= j + 1 for j, o, c in zip(range(1, 4), outs[12:15], cached[12:15]))
    assert [len(o.prompt_token_ids) - c for o, c in zip(outs[15:], cached[15:])] == list(range(1, K + 2))
    check_accounting(llm)


def check_node(engine, tokens, depth) -> bool:
    """The node at `depth` on tokens' path has a snapshot; the draft's KV in the tree's slots and (unless the snapshot
    is partial) the draft's half of the snapshot equal a fresh prefill of the draft. Returns whether it is partial."""
    cache, draft = engine.prefix_cache, engine.runner.proposer.draft
    node = cache.tree.match(key_elements(tokens, depth, 0))[-1]
    assert node.depth == depth and node.snapshot is not None
    (k_ref, v_ref), conv_ref, ssm_ref = _recompute(draft, engine.model.caches.kv_pool, tokens[:depth])
    tree_slots = cache.tree.path_slots(node).long()
    assert close(draft.caches.kv_pool.k_buffer[:, tree_slots], k_ref)
    assert close(draft.caches.kv_pool.v_buffer[:, tree_slots], v_ref)
    if not node.snapshot.partial:
        slot = node.snapshot.slot
        half = cache.draft_snapshots
        assert close(half.conv[:, slot], conv_ref) and close(half.ssm[:, slot], ssm_ref)
    return node.snapshot.partial


def run_checking_draft_state(engine, prompt, params) -> list[int]:
    """Runs one request to its end; after every step past its prompt the draft's committed state (conv window and SSM
    row at accept_len - 1) and its KV at every position equal a fresh prefill of the draft over the committed tokens."""
    draft, state = engine.runner.proposer.draft, engine.runner.state
    lin = draft.caches.req_manager.linear_state
    req, steps = engine.add_request(prompt, params), 0
    while engine.has_unfinished():
        engine.step_outputs()
        if req.req_idx is None or req.in_prefill:
            continue
        tokens = req.prompt_ids + req.output_ids
        accept = int(state.accept_len[req.req_idx])
        (k_ref, v_ref), conv_ref, ssm_ref = _recompute(draft, engine.model.caches.kv_pool, tokens)
        assert close(lin.conv[:, req.req_idx, :, accept - 1 : accept - 1 + lin.conv_cols], conv_ref)
        assert close(lin.ssm[:, req.req_idx * lin.rows_per_req + accept - 1], ssm_ref)
        live = draft.caches.req_manager.req_to_token[req.req_idx, : len(tokens)].long()
        assert close(draft.caches.kv_pool.k_buffer[:, live], k_ref)
        assert close(draft.caches.kv_pool.v_buffer[:, live], v_ref)
        steps += 1
    assert steps >= 1
    return req


@pytest.mark.parametrize("pard,catch_up_rows", [(False, 4096), (True, 4096), (False, 1)],
                         ids=["draft_model", "pard", "draft_model-catch_up_in_1_row_passes"])
def test_draft_state_cached_and_resumed_equals_recompute(pard, catch_up_rows, monkeypatch):
    """The draft's half of each prompt snapshot and its KV in the tree's slots equal a fresh prefill of the draft; a
    request resuming from them has after every step the draft state of a fresh prefill over its committed tokens. A
    finished request's end snapshot holds the draft's state one row before its committed one when its last verify
    accepted a draft, else it is partial and a hit advances the draft from the snapshot above (catch-up): both resume
    with the draft state, tokens and acceptance of no cache (also when the catch-up runs in passes of a few rows)."""
    monkeypatch.setattr(draft_model_proposer, "CATCH_UP_ROWS", catch_up_rows)
    llm = build(True, pard, disable_overlap=True)
    engine = llm.engine
    prompt = [(13 * i) % 500 + 7 for i in range(27)]
    llm.generate([prompt], greedy(2))
    for b in (8, 16, 24, 27):
        assert not check_node(engine, prompt, b)
    req = run_checking_draft_state(engine, prompt[:20] + [901, 902, 903], greedy(12))
    assert req.num_cached_tokens == 16
    partial = set()
    for n in range(3, 10):
        out = llm.generate([prompt[:12] + [700 + n, 5, 6]], greedy(n))[0]
        tokens = out.prompt_token_ids + out.token_ids
        end = llm.engine.prefix_cache.tree.match(key_elements(tokens, len(tokens), 0))[-1].depth
        assert end >= len(tokens) - 1  # the end (verify rows past the length cut: the last token too)
        is_partial = check_node(engine, tokens, end)
        partial.add(is_partial)
        before = engine.prefix_cache_stats().draft_catch_up_tokens
        resend = tokens[:end] + [5, 6]
        got = run_checking_draft_state(engine, resend, greedy(4))
        want = build(False, pard, disable_overlap=True).generate([resend], greedy(4))[0]
        assert got.num_cached_tokens == end and (got.output_ids, got.spec_stats) == (want.token_ids, want.spec)
        caught_up = engine.prefix_cache_stats().draft_catch_up_tokens - before
        assert caught_up == (end - len(out.prompt_token_ids) if is_partial else 0)  # from the prompt's end
        if partial == {True, False}:
            break
    assert partial == {True, False}
    check_accounting(llm)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "sync"])
def test_request_ending_on_a_stop_token_leaves_its_end(overlap):
    """A chat that stops on a stop token is cached up to its end, also when its next verify was already queued
    (overlap: that verify's first row, past the stop token, with a partial snapshot): the resend resumes there with
    the tokens and acceptance of no cache, the draft catching up."""
    prompt = SYSTEM + [5, 6]
    full = build(False, False, disable_overlap=not overlap).generate([prompt], greedy(12))[0].token_ids
    i = next(j for j in range(3, 10) if full[j] not in full[:j])
    stop = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=[full[i]])
    resend = prompt + full[: i + 3] + [777]
    ref = build(False, False, disable_overlap=not overlap).generate([resend], greedy())[0]
    llm = build(True, False, disable_overlap=not overlap)
    first = llm.generate([prompt], stop)[0]
    assert first.token_ids == full[: i + 1] and first.finish_reason == "stop"
    llm.engine.overlap = False  # the state checks read the device state the host has seen
    out = run_checking_draft_state(llm.engine, resend, greedy())
    assert (out.output_ids, out.spec_stats) == (ref.token_ids, ref.spec)
    assert out.num_cached_tokens == len(prompt) + i + overlap  # up to the stop token, or past it (overlap)
    if overlap:  # the draft's state after the queued verify's row was gone: it caught up from the prompt's end
        assert llm.engine.prefix_cache_stats().draft_catch_up_tokens == i + 1
    check_accounting(llm)


def close(a, b) -> bool:
    torch.testing.assert_close(a, b, **ATOL)
    return True


def test_budget_counts_the_draft_and_host_tier_carries_it():
    """One KV slot holds the target's and the draft's KV, one snapshot both GDN states: the split counts both. With 4
    device snapshots every admission evicts; the host tier takes both halves and brings them back exactly."""
    llm = build(True, False, max_total_token_num=None, prefix_cache_state_share=0.001)
    engine = llm.engine
    draft = engine.runner.proposer.draft
    states = [engine.model.caches.req_manager.linear_state, draft.caches.req_manager.linear_state]
    per_snapshot = sum(StateSnapshotPool.bytes_per_snapshot(s) for s in states)
    kv = [engine.model.caches.kv_pool, draft.caches.kv_pool]
    per_token = sum(p.k_buffer[:, 0].numel() * 2 * p.k_buffer.element_size() for p in kv)
    budget = engine.cache_budget
    assert (budget.kv_bytes_per_token, budget.snapshot_bytes) == (per_token, per_snapshot)
    assert engine.prefix_cache.snapshots.size == engine.prefix_cache.draft_snapshots.size == budget.num_snapshots == 4
    prompts = [SYSTEM[: 8 + (i % 3) * 4] + [100 + i, 200] for i in range(6)]

    def run(llm):
        return [llm.generate([p], greedy(4))[0] for _ in range(2) for p in prompts]

    ref = run(build(False, False))
    llm = build(True, False, max_total_token_num=None, prefix_cache_state_share=0.001,
                prefix_cache_host_gb=40 * per_snapshot / 2**30)  # fmt: skip
    assert llm.engine.prefix_cache.tree.host.allocator.size == 40
    outs = run(llm)
    assert [(o.token_ids, o.spec) for o in outs] == [(o.token_ids, o.spec) for o in ref]
    stats = llm.engine.prefix_cache_stats()
    assert stats.host_fetches > 0 and stats.hits >= len(prompts)
    check_accounting(llm)
    assert llm.engine.prefix_cache.tree.host.allocator.num_free == 40


def test_a_draft_with_another_conv_kernel_is_refused():
    model = SimpleNamespace(cfg=SimpleNamespace(linear_conv_kernel_dim=4))
    proposer = SimpleNamespace(draft=SimpleNamespace(cfg=SimpleNamespace(linear_conv_kernel_dim=3)))
    with pytest.raises(ValueError, match="linear_conv_kernel_dim"):
        draft_snapshot_pool(proposer, model, 4)
    assert draft_snapshot_pool(SimpleNamespace(), model, 4) is None  # MTP proposers: no draft model


def test_abort_mid_prefill_of_a_request_resumed_from_a_partial_snapshot():
    """A request resumed from a partial end snapshot (the draft caught up) is aborted mid-prefill: its pins and locks
    go, and the next request on the same prefix resumes there with the output and acceptance of no cache."""
    prompt = SYSTEM + [5, 6]
    full = build(False, False).generate([prompt], greedy(12))[0].token_ids
    i = next(j for j in range(3, 10) if full[j] not in full[:j])
    stop = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=[full[i]])
    llm = build(True, False, chunked_prefill_size=4)
    engine = llm.engine
    assert llm.generate([prompt], stop)[0].token_ids == full[: i + 1]  # overlap: its end is a partial snapshot
    turn = prompt + full[: i + 1]
    victim = engine.add_request(turn + list(range(100, 120)), greedy())
    engine.step()
    assert victim.num_cached_tokens == len(turn) and victim.in_prefill
    assert engine.prefix_cache_stats().draft_catch_up_tokens == i + 1
    engine.abort(victim)
    after = turn + [7, 8, 9]
    want = build(False, False).generate([after], greedy())[0]
    got = llm.generate([after], greedy())[0]
    assert (got.token_ids, got.spec, got.num_cached_tokens) == (want.token_ids, want.spec, len(turn))
    check_accounting(llm)
