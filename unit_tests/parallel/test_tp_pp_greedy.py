"""tp / pp groups on CPU (gloo, spawned processes): greedy tokens identical to one process, for dense and MoE
checkpoints, without MTP and with eagle k=2 and vanilla (multi-layer) k=2, over a workload with chunked prefill,
mixed lengths, queueing, stops and an abort (workload.py).

fp32 on CPU: tp=2 sums each row-parallel output in another order (two partial sums, then the all-reduce), so
logits differ from one process by ~1e-6 relative; the trained tiny checkpoints have no greedy near-tie on these
prompts, so their tokens must be identical. pp changes no arithmetic: tokens and state are bit-identical."""

import pytest

from unit_tests.parallel.workload import DENSE, MOE, MTP3, count_launch_ahead, engine, run

EAGLE = dict(mtp_mode="eagle_with_att", mtp_step=2)
VANILLA = dict(mtp_mode="vanilla_with_att", mtp_step=2)
PTD = dict(mtp_mode="eagle_with_att", mtp_step=3, parallel_drafting=True)
# benchmarking's forced acceptance: every rank draws the same coins (the rule's seeded generator), so the accepted
# drafts, and with them the tokens, are the one process's
FORCED = dict(mtp_mode="eagle_with_att", mtp_step=2, mtp_force_acceptance="0.7,0.5")
CASES = [  # (checkpoint, MTP, tp, pp); plain dense tp=2 runs in test_faults.py and the server e2e suite
    (DENSE, EAGLE, 2, 1),
    (MOE, {}, 2, 1),
    (MOE, EAGLE, 2, 1),
    (MTP3, VANILLA, 2, 1),
    (MTP3, PTD, 2, 1),  # parallel drafting: mask rows through the vocab-parallel embedding
    (DENSE, EAGLE, 1, 2),
    (MOE, {}, 1, 2),
    (MTP3, VANILLA, 1, 2),
    (MOE, EAGLE, 2, 2),
    (DENSE, EAGLE, 4, 1),  # 2 KV heads and 2 GDN key heads over 4 ranks: each replicated on 2
    (DENSE, FORCED, 2, 1),
    (DENSE, FORCED, 1, 2),
]
IDS = [
    f"{m.name.removeprefix('tiny_qwen3_5_').removesuffix('_trained')}-"
    f"{'ptd' if d.get('parallel_drafting') else d.get('mtp_mode', 'plain').split('_')[0]}"
    f"{'-forced' if d.get('mtp_force_acceptance') else ''}"
    f"-tp{tp}-pp{pp}"
    for m, d, tp, pp in CASES
]
_reference: dict = {}


def reference(model_dir, mtp):
    key = (model_dir, tuple(sorted(mtp.items())))
    if key not in _reference:
        _reference[key] = run(engine(model_dir, mtp))
    return _reference[key]


@pytest.mark.parametrize("model_dir,mtp,tp,pp", CASES, ids=IDS)
def test_greedy_tokens_identical_to_one_process(model_dir, mtp, tp, pp):
    want = reference(model_dir, mtp)
    eng = engine(model_dir, mtp, tp=tp, pp=pp)
    ahead = count_launch_ahead(eng)
    try:
        got = run(eng)
    finally:
        eng.shutdown()
    assert got == want
    assert ahead[0] > 0  # overlap scheduling: steps queued before the previous one was read
    reasons = [reason for _, reason in want]
    assert {"abort", "length", "stop"} <= set(reasons)
    assert 0 < len(want[0][0]) < 30  # aborted mid-generation


def test_reduced_draft_vocabulary_under_tp(tmp_path):
    """The draft's lm_head rows of a reduced vocabulary, gathered whole on every tp rank: same tokens as one process
    with the same vocabulary file."""
    import json

    path = tmp_path / "vocab.json"
    path.write_text(json.dumps({"token_ids": list(range(0, 4096, 2)), "always": [], "vocab_size": 4096}))
    mtp = dict(EAGLE, mtp_draft_vocab_file=str(path))
    want = run(engine(DENSE, mtp))
    eng = engine(DENSE, mtp, tp=2)
    try:
        assert run(eng) == want
    finally:
        eng.shutdown()
