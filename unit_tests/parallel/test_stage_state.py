"""No rank runs on optimistic state: after steps with rejected drafts, every pipeline stage's cached state for its
layers equals a one-process run's state for the same layers (positions and block rows in DraftState, the page
table, KV of committed tokens, the widened conv window, SSM rows), bit for bit. Under tp=2 each rank's heads
and channels, put back together, equal the one-process state within fp32 all-reduce rounding (rtol = atol = 1e-4).
Mid-run snapshots (LLMEngine.save_state), so that requests are still running with open blocks."""

import pytest
import torch

from lightllm_mtp.config.model_config import ModelConfig
from unit_tests.parallel.workload import DENSE, MOE, engine, run

EAGLE = dict(mtp_mode="eagle_with_att", mtp_step=2)
STEPS = 9


def snapshot(eng, directory, world):
    eng.save_state(directory)
    return [torch.load(directory / f"rank{r}.pt") for r in range(world)]


def running(eng):
    reqs = list(eng.scheduler.running)
    assert reqs, "the snapshot should catch requests mid-generation"
    return reqs


def run_both(model_dir, tmp_path, tp, pp):
    ref = engine(model_dir, EAGLE)
    run(ref, stop_after=STEPS)
    (tmp_path / "ref").mkdir()
    (want,) = snapshot(ref, tmp_path / "ref", 1)
    eng = engine(model_dir, EAGLE, tp=tp, pp=pp)
    try:
        run(eng, stop_after=STEPS)
        (tmp_path / "par").mkdir()
        got = snapshot(eng, tmp_path / "par", tp * pp)
        reqs = running(eng)
        assert [(r.req_idx, r.num_computed) for r in reqs] == [(r.req_idx, r.num_computed) for r in running(ref)]
        stats = [r.spec_stats for r in reqs]
        assert sum(s.drafts - s.accepted_drafts for s in stats) > 0, "the run must reject drafts"
    finally:
        eng.shutdown()
    return want, got, reqs


@pytest.mark.parametrize("model_dir,pp", [(MOE, 2), (DENSE, 3)], ids=["moe-pp2", "dense-pp3"])  # pp3: a middle stage
def test_pipeline_stages_hold_the_committed_state_only(tmp_path, model_dir, pp):
    want, stages, reqs = run_both(model_dir, tmp_path, tp=1, pp=pp)
    layer_keys = [k for k in want if k.startswith("layer.")]
    seen = set()
    rows = 1 + EAGLE["mtp_step"]
    for stage in stages:
        assert torch.equal(stage["draft_table"], want["draft_table"])  # positions, accept lengths, block rows
        for r in reqs:
            slots = stage["req_to_token"][r.req_idx, : r.num_computed].long()
            assert torch.equal(slots, want["req_to_token"][r.req_idx, : r.num_computed].long())
            for key in [k for k in stage if k.startswith("layer.")]:
                seen.add(key)
                if key.endswith((".k", ".v")):  # KV of committed tokens
                    assert torch.equal(stage[key][slots], want[key][slots]), key
                elif key.endswith(".conv"):  # the widened conv window of the request's slot
                    assert torch.equal(stage[key][r.req_idx], want[key][r.req_idx]), key
                else:  # its k+1 SSM rows
                    ssm = slice(r.req_idx * rows, (r.req_idx + 1) * rows)
                    assert torch.equal(stage[key][ssm], want[key][ssm]), key
    assert seen == set(layer_keys)  # every layer on exactly one stage
    owned = [set(stage) & set(layer_keys) for stage in stages]
    assert sum(map(len, owned)) == len(layer_keys) and all(owned)


def test_tensor_parallel_shards_reassemble_to_the_one_process_state(tmp_path):
    cfg = ModelConfig.from_model_dir(DENSE)
    want, ranks, reqs = run_both(DENSE, tmp_path, tp=2, pp=1)
    close = dict(rtol=1e-4, atol=1e-4)
    rows = 1 + EAGLE["mtp_step"]
    for r in reqs:
        slots = want["req_to_token"][r.req_idx, : r.num_computed].long()
        ssm = slice(r.req_idx * rows, (r.req_idx + 1) * rows)
        for key in [k for k in want if k.startswith("layer.")]:
            if key.endswith((".k", ".v")):  # [slots, kv heads, D]: rank r holds kv heads [r * H/tp, ...)
                got = torch.cat([rank[key][slots] for rank in ranks], dim=1)
                torch.testing.assert_close(got, want[key][slots], **close)
            elif key.endswith(".ssm"):  # [rows, value heads, dk, dv]
                got = torch.cat([rank[key][ssm] for rank in ranks], dim=1)
                torch.testing.assert_close(got, want[key][ssm], **close)
            else:  # conv channels [q | k | v], each section split over the ranks
                parts = [rank[key][r.req_idx] for rank in ranks]
                kd, vd = cfg.linear_key_dim // 2, cfg.linear_value_dim // 2
                split = [p.split([kd, kd, vd]) for p in parts]
                got = torch.cat([torch.cat([s[i] for s in split]) for i in range(3)])
                torch.testing.assert_close(got, want[key][r.req_idx], **close)
    for rank in ranks:
        assert torch.equal(rank["draft_table"], want["draft_table"])


def test_sampling_ranks_draw_the_same_tokens(tmp_path):
    """Temperature sampling under tp=2 (overlap off): every rank samples from the same gathered logits with the same
    generator (an unseeded request gets one from the driver), so the ranks' block rows and page tables stay equal;
    a seeded request gives the one-process tokens (its logits differ only by all-reduce rounding)."""
    from lightllm_mtp.sampling_params import SamplingParams

    params = [SamplingParams(temperature=0.8, max_new_tokens=12, seed=7),
              SamplingParams(temperature=1.0, max_new_tokens=40)]  # fmt: skip
    prompts = [[5, 17, 300, 42, 9], [900, 4, 4, 250, 31, 8]]

    def start(**kwargs):
        eng = engine(DENSE, EAGLE, disable_overlap=True, **kwargs)
        return eng, [eng.add_request(p, sp) for p, sp in zip(prompts, params)]

    ref, ref_reqs = start()
    while ref.has_unfinished():
        ref.step_outputs()
    eng, reqs = start(tp=2)
    try:
        for _ in range(6):
            eng.step_outputs()
        eng.save_state(tmp_path)
        ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
        assert torch.equal(ranks[0]["draft_table"], ranks[1]["draft_table"])
        assert torch.equal(ranks[0]["req_to_token"], ranks[1]["req_to_token"])
        while eng.has_unfinished():
            eng.step_outputs()
    finally:
        eng.shutdown()
    assert reqs[0].output_ids == ref_reqs[0].output_ids
    assert len(reqs[1].output_ids) == 40
