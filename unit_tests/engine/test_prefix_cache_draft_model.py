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
from lightllm_mtp.tools.default_checkpoint import FIXTURES_DIR
from unit_tests.engine.test_prefix_cache import check_accounting
from unit_tests.spec_decode.test_draft_model import _recompute

TARGET = FIXTURES_DIR / "tiny_qwen3_5_trained"
DRAFTS = {False: FIXTURES_DIR / "tiny_qwen3_5_draft_trained", True: FIXTURES_DIR / "tiny_qwen3_5_draft_pard_trained"}
K = 2
INTERVAL = 8
SYSTEM = [(37 * i) % 700 + 3 for i in range(21)]
ATOL = dict(atol=2e-5, rtol=1e-4)  # window / verify rows vs a prefill: fp32 rounding of differently shaped GEMMs


def greedy(n=6):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


def build(cache, pard, **kw):
    kw.setdefault("max_total_token_num", 32 * 8 * 96)  # ~115 snapshots: none evicted in these workloads
    kw.setdefault("prefix_cache_state_share", 0.9)
    return LLM(TARGET, max_model_len=96, chunked_prefill_size=16, prefix_cache=cache, prefix_cache_interval=INTERVAL,
               mtp_mode="draft_model", mtp_step=K, mtp_draft_model_dir=DRAFTS[pard], parallel_drafting=pard,
               **kw)  # fmt: skip


def rounds(first_output):
    """A cold request; two concurrent questions on the system prompt; a branch at every offset of a snapshot
    interval; a multi-turn resend of the first chat with 0..3 new tokens; its prompt + 1..k+1 new tokens."""
    q1 = SYSTEM + [11, 12, 13, 14]
    turn = q1 + first_output
    return [
        [q1],
        [SYSTEM + [21, 22, 23], SYSTEM + [31, 32, 33, 34, 35, 36]],
        [SYSTEM[: 2 * INTERVAL + j] + [600 + j, 601, 602] for j in range(INTERVAL)],
        [turn + [40 + i for i in range(j)] for j in range(4)],
        [q1 + [50 + i for i in range(j)] for j in range(1, K + 2)],
    ]


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
    assert min(cached[11:15]) >= q1  # the resend: at least the first chat's prompt end
    assert [len(o.prompt_token_ids) - c for o, c in zip(outs[15:], cached[15:])] == list(range(1, K + 2))
    check_accounting(llm)


@pytest.mark.parametrize("pard", [False, True], ids=["draft_model", "pard"])
def test_draft_state_cached_and_resumed_equals_recompute(pard):
    """The draft's half of each prompt snapshot and its KV in the tree's slots equal a fresh prefill of the draft;
    a request resuming from them has, after every step, the draft state of a fresh prefill over its committed tokens;
    a request whose last verify accepted a draft leaves an end snapshot whose draft half is that of a fresh prefill
    (the draft row before its committed one), and a resend resumes there with the acceptance it has without the cache."""
    llm = build(True, pard, disable_overlap=True)
    engine = llm.engine
    cache, pool, draft = engine.prefix_cache, engine.model.caches.kv_pool, engine.runner.proposer.draft
    dstate, snaps = draft.caches.req_manager.linear_state, cache.draft_snapshots
    k1 = dstate.conv_cols
    prompt = [(13 * i) % 500 + 7 for i in range(27)]
    llm.generate([prompt], greedy(2))

    def check_node(tokens, depth):
        node = cache.tree.match(key_elements(tokens, depth, 0))[-1]
        assert node.depth == depth and node.snapshot is not None
        (k_ref, v_ref), conv_ref, ssm_ref = _recompute(draft, pool, tokens[:depth])
        slot, tree_slots = node.snapshot.slot, cache.tree.path_slots(node).long()
        assert torch_close(snaps.conv[:, slot], conv_ref) and torch_close(snaps.ssm[:, slot], ssm_ref)
        assert torch_close(draft.caches.kv_pool.k_buffer[:, tree_slots], k_ref)
        assert torch_close(draft.caches.kv_pool.v_buffer[:, tree_slots], v_ref)

    for b in (8, 16, 24, 27):
        check_node(prompt, b)
    state = engine.runner.state
    req = engine.add_request(prompt[:20] + [901, 902, 903], greedy(12))
    steps = 0
    while engine.has_unfinished():
        engine.step_outputs()
        if req.req_idx is None or req.in_prefill:
            continue
        tokens = req.prompt_ids + req.output_ids
        accept = int(state.accept_len[req.req_idx])
        (k_ref, v_ref), conv_ref, ssm_ref = _recompute(draft, pool, tokens)
        assert torch_close(dstate.conv[:, req.req_idx, :, accept - 1 : accept - 1 + k1], conv_ref)
        assert torch_close(dstate.ssm[:, req.req_idx * dstate.rows_per_req + accept - 1], ssm_ref)
        live = draft.caches.req_manager.req_to_token[req.req_idx, : len(tokens)].long()
        assert torch_close(draft.caches.kv_pool.k_buffer[:, live], k_ref)
        assert torch_close(draft.caches.kv_pool.v_buffer[:, live], v_ref)
        steps += 1
    assert req.num_cached_tokens == 16 and steps >= 3
    # end snapshots: over a few output lengths, some last verifies accept a draft (an end snapshot) and some not
    ends = set()
    for n in range(3, 9):
        out = llm.generate([prompt[:12] + [700 + n, 5, 6]], greedy(n))[0]
        tokens = out.prompt_token_ids + out.token_ids
        depth = len(tokens)  # L = 0: the tree may hold the last output token (verify rows past a length cut too)
        path = cache.tree.match(key_elements(tokens, depth, 0))
        end = max(n.depth for n in path)
        has_end = path[-1].depth == end and path[-1].snapshot is not None and end > len(out.prompt_token_ids)
        ends.add(has_end)
        if has_end:
            check_node(tokens, end)
            resend = tokens[:end] + [5, 6]
            got = llm.generate([resend], greedy(4))[0]
            want = build(False, pard, disable_overlap=True).generate([resend], greedy(4))[0]
            assert got.num_cached_tokens == end and (got.token_ids, got.spec) == (want.token_ids, want.spec)
        if ends == {True, False}:
            break
    assert ends == {True, False}
    check_accounting(llm)


def torch_close(a, b) -> bool:
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
