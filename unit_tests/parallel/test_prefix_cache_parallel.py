"""The prefix cache under tp / pp (CPU, gloo, spawned processes): every rank keeps a copy of the driver's tree by
replaying its calls (engine/parallel/step_ops.py). A shared system prompt with two different questions, then a
multi-turn resend of the first chat: greedy tokens identical to one process without the cache, hits happen, every
rank's tree agrees with the driver's and its pools are free or the tree's after the workload (empty after evicting
it), and mid-run, right after the hits' first steps, each stage's state (KV of the requests' tokens, conv window,
SSM rows, snapshot pool) equals the one-process run's with the cache for the same layers: bit for bit under pp,
within fp32 all-reduce rounding under tp."""

import pytest
import torch

from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.engine.cache_budget import snapshot_bytes
from lightllm_mtp.sampling_params import SamplingParams
from unit_tests.parallel.workload import DENSE, MOE, MTP3, engine, run

EAGLE = dict(mtp_mode="eagle_with_att", mtp_step=2)
INTERVAL = 8
SYSTEM = [(37 * i) % 700 + 3 for i in range(21)]
CACHE = dict(prefix_cache=True, prefix_cache_interval=INTERVAL, chunked_prefill_size=16,
             max_total_token_num=3072, prefix_cache_state_share=0.75)  # about 70 snapshots: none evicted
PAUSE_AT = 2  # steps into the second round (the hits): save every rank's state there
VANILLA = dict(mtp_mode="vanilla_with_att", mtp_step=2)  # two modules: the tree's keys look 2 tokens ahead
CASES = [(DENSE, {}, 2, 1), (DENSE, EAGLE, 1, 2), (MOE, EAGLE, 2, 1), (MOE, {}, 1, 2), (MTP3, VANILLA, 1, 2),
         (DENSE, EAGLE, 2, 2)]
IDS = [f"{ {DENSE: 'dense', MOE: 'moe', MTP3: 'mtp3'}[m]}-{d.get('mtp_mode', 'plain').split('_')[0]}-tp{tp}-pp{pp}"
       for m, d, tp, pp in CASES]  # fmt: skip


def greedy():
    return SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)


def chat(eng, directory=None, world=1):
    """(tokens, cached tokens) per request over three rounds, each run to its end: one question on the system
    prompt; two more at once; the first chat resent with a new turn. directory: every rank's state is saved there
    PAUSE_AT steps into the second round (returned with the requests then running)."""
    q1 = SYSTEM + [11, 12, 13, 14]
    outs, saved = [], None
    for i in range(3):
        prompts = [[q1], [SYSTEM + [21, 22, 23], SYSTEM + [31, 32, 33, 34, 35, 36]],
                   [q1 + outs[0][0] + [40, 41, 42]] if outs else []][i]  # fmt: skip
        reqs = [eng.add_request(p, greedy()) for p in prompts]
        steps = 0
        while eng.has_unfinished():
            eng.step_outputs()
            steps += 1
            if i == 1 and steps == PAUSE_AT and directory is not None:
                eng.save_state(directory)
                states = [torch.load(directory / f"rank{r}.pt") for r in range(world)]
                saved = states, [(r.req_idx, r.num_computed) for r in eng.scheduler.running]
        outs += [(list(r.output_ids), r.num_cached_tokens) for r in reqs]
    return outs, saved


def accounting(eng, directory, world):
    """Every rank's digest after the workload, and after evicting the tree."""
    directory.mkdir()
    eng.save_state(directory)
    after = [torch.load(directory / f"rank{r}.pt")["prefix_cache"].tolist() for r in range(world)]
    eng.evict_prefix_cache()
    eng.save_state(directory)
    evicted = [torch.load(directory / f"rank{r}.pt")["prefix_cache"].tolist() for r in range(world)]
    return after, evicted


def layer_keys(state):
    return [k for k in state if k.startswith(("layer.", "snapshot."))]


def cat_conv(parts, dim, cfg):
    """tp ranks' conv channels [q | k | v], each section split over the ranks, put back together along `dim`."""
    kd, vd = cfg.linear_key_dim // len(parts), cfg.linear_value_dim // len(parts)
    split = [p.split([kd, kd, vd], dim=dim) for p in parts]
    return torch.cat([torch.cat([s[i] for s in split], dim=dim) for i in range(3)], dim=dim)


def compare_stage(stage, want, running, rows, cfg):
    """A pipeline stage's ranks (one: bit for bit; tp ranks: put back together, within all-reduce rounding)."""
    for idx, n in running:
        slots = want["req_to_token"][idx, :n].long()
        for rank in stage:
            assert torch.equal(rank["req_to_token"][idx, :n].long(), slots)
        for key in layer_keys(stage[0]):
            if key.endswith((".k", ".v")):  # KV of the request's tokens ([slots, kv heads, D]): cached, then its own
                got, ref, dim = [r[key][slots] for r in stage], want[key][slots], 1
            elif key.startswith("snapshot."):  # [slots, conv channels, K-1] / [slots, value heads, dk, dv]
                got, ref, dim = [r[key] for r in stage], want[key], 1
            elif key.endswith(".conv"):  # the request's conv window [channels, width]
                got, ref, dim = [r[key][idx] for r in stage], want[key][idx], 0
            else:  # its SSM rows [rows, value heads, dk, dv]
                ssm = slice(idx * rows, (idx + 1) * rows)
                got, ref, dim = [r[key][ssm] for r in stage], want[key][ssm], 1
            if len(stage) == 1:
                assert torch.equal(got[0], ref), key
            else:
                whole = cat_conv(got, dim, cfg) if key.endswith(".conv") else torch.cat(got, dim=dim)
                torch.testing.assert_close(whole, ref, rtol=1e-4, atol=1e-4, msg=key)


@pytest.mark.parametrize("model_dir,mtp,tp,pp", CASES, ids=IDS)
def test_prefix_cache_under_tp_pp(tmp_path, model_dir, mtp, tp, pp):
    want, _ = chat(engine(model_dir, mtp, prefix_cache=False))
    (tmp_path / "ref").mkdir()
    (tmp_path / "par").mkdir()
    ref_outs, (ref_states, ref_running) = chat(engine(model_dir, mtp, **CACHE), tmp_path / "ref")
    eng = engine(model_dir, mtp, tp=tp, pp=pp, **CACHE)
    try:
        got, (states, running) = chat(eng, tmp_path / "par", tp * pp)
        after, evicted = accounting(eng, tmp_path / "end", tp * pp)
        kv_size, reqs = eng.model.caches.kv_pool.size, eng.model.caches.req_manager.max_reqs
        num_snapshots = eng.prefix_cache.snapshots.size
    finally:
        eng.shutdown()
    assert [t for t, _ in got] == [t for t, _ in want]  # tokens as without the cache
    assert got == ref_outs  # hits as in one process
    cached = [c for _, c in got]
    assert cached[0] == 0 and min(cached[1:]) >= 2 * INTERVAL
    assert cached[3] >= len(SYSTEM) + 4  # the resend resumes past the first prompt
    assert all(d == after[0] for d in after) and all(d == evicted[0] for d in evicted)
    free_kv, tree_tokens, locked, snapshots, host, free_reqs = after[0]
    assert free_kv + tree_tokens == kv_size and tree_tokens > 0 and locked == 0 and free_reqs == reqs
    assert evicted[0] == [kv_size, 0, 0, 0, 0, reqs] and snapshots <= num_snapshots
    # state right after the hits' first steps, stage by stage
    assert running == ref_running and running
    rows = 1 + mtp.get("mtp_step", 0)
    (want_state,) = ref_states
    seen = set()
    for s in range(pp):
        stage = states[s * tp : (s + 1) * tp]
        seen |= set(layer_keys(stage[0]))
        compare_stage(stage, want_state, running, rows, ModelConfig.from_model_dir(model_dir))
    assert seen == set(layer_keys(want_state))  # every layer and its snapshots on exactly one stage


@pytest.mark.parametrize("tp,pp,host_snapshots", [(2, 1, 0), (1, 2, 16)])
def test_evictions_stops_and_aborts_replay_alike(tp, pp, host_snapshots):
    """The parallel workload (chunked prefill, queueing, stop tokens inside accepted MTP blocks, an abort), twice in
    one engine (the second pass resumes from the first's prompts and ends), on a KV pool of one max-length request:
    allocations evict, admission waits for locked slots (pp: evicted snapshots go to a host tier, sized alike on
    every stage from the whole model's bytes per snapshot). Every follower's tree must follow the driver's (checked at
    each launch); tokens and hits equal one process's with the cache, tokens equal one process's without it."""
    mtp = EAGLE
    per = snapshot_bytes(ModelConfig.from_model_dir(DENSE), 4)
    small = dict(prefix_cache=True, prefix_cache_interval=INTERVAL, max_total_token_num=2400,
                 prefix_cache_state_share=0.95, prefix_cache_host_gb=host_snapshots * per / 2**30)  # fmt: skip
    want = [run(engine(DENSE, mtp)) for _ in range(2)]
    ref = engine(DENSE, mtp, **small)
    ref_out = [run(ref) for _ in range(2)]
    eng = engine(DENSE, mtp, tp=tp, pp=pp, **small)
    try:  # one max-length request (128 tokens and its MTP lookahead slots) of KV, 16 device snapshots
        assert eng.model.caches.kv_pool.size == ref.model.caches.kv_pool.size == 128 + ref.scheduler.lookahead_slots
        assert eng.prefix_cache.snapshots.size == ref.prefix_cache.snapshots.size == 16
    except AssertionError:
        eng.shutdown()  # the followers wait for the driver otherwise
        raise
    tree, evicted = eng.prefix_cache.tree, []
    evict = tree.evict  # RadixCache.alloc_kv evicts what an allocation misses
    tree.evict = lambda n: evicted.append(evict(n)) or evicted[-1]
    try:
        got = [run(eng) for _ in range(2)]
        hits = eng.prefix_cache_stats().hits
        offloaded = eng.prefix_cache_stats().host_snapshots
        reclaimed = sum(evicted)  # by allocations, before evict_all's
        eng.evict_prefix_cache()
    finally:
        eng.shutdown()
    assert got == ref_out and hits == ref.prefix_cache_stats().hits > 0
    assert reclaimed > 0 and (offloaded > 0) == (host_snapshots > 0)
    for g, w in zip(got, want):  # the aborted request (index 0) may get further before its abort with hits
        assert g[1:] == w[1:] and g[0][0] == w[0][0][: len(g[0][0])]
