"""Tensor / pipeline layout checks that need no processes: bad combinations fail at start with one message, stage
splits, TpShard slices, and the sharded loader reading exactly this rank's slices."""

import pytest
import torch

from lightllm_mtp.common.tensor_spec import TpShard
from lightllm_mtp.common.weight_loader import load_tensors
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.config.parallel_config import ParallelConfig
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.models.registry import model_class
from unit_tests.trained_fixtures import DENSE, MOE


def test_bad_combinations_fail_at_start_with_one_message():
    cfg = ModelConfig.from_model_dir(DENSE)  # 4 heads, 2 kv heads, 2/4 GDN heads, 8 layers
    with pytest.raises(ValueError) as e:
        ParallelConfig(tp=3, pp=9).check_model(cfg)
    text = str(e.value)
    assert "num_attention_heads=4 is not divisible by tp=3" in text and "pp=9 stages for 8 layers" in text
    assert "num_key_value_heads=2 neither divides nor is divisible by tp=3" in text
    ParallelConfig(tp=4).check_model(cfg)  # 2 KV heads, 2 GDN key heads: each replicated on 2 ranks
    with pytest.raises(ValueError, match="num_attention_heads=4 is not divisible by tp=8"):
        LLMEngine(EngineArgs(model_dir=str(DENSE), tp=8))  # before any process starts
    for bad in (dict(tp=0), dict(pp=-1), dict(tp=2, dist_timeout_s=0)):
        with pytest.raises(ValueError):
            EngineArgs(model_dir=str(DENSE), **bad)


def test_stage_layers_cover_every_layer_once():
    for layers, pp in [(8, 2), (8, 3), (5, 5), (40, 3)]:
        cfg = ParallelConfig(pp=pp)
        stages = [cfg.stage_layers(layers, s) for s in range(pp)]
        assert [i for r in stages for i in r] == list(range(layers))
        assert max(map(len, stages)) - min(map(len, stages)) <= 1


def test_tp_shard_ranges():
    qkv = TpShard(0, sections=(4, 4, 8))
    assert qkv.ranges(16, 0, 2) == [(0, 2), (4, 6), (8, 12)]
    assert qkv.ranges(16, 1, 2) == [(2, 4), (6, 8), (12, 16)]
    vocab = TpShard(0, pad=True)
    assert vocab.ranges(10, 0, 4) == [(0, 3)] and vocab.ranges(10, 3, 4) == [(9, 10)]
    assert vocab.local_size(10, 4) == 3
    kv = TpShard(0, heads=(2,))  # 2 heads of 8 rows over 4 ranks: each head on 2 consecutive ranks
    assert [kv.ranges(16, r, 4) for r in range(4)] == [[(0, 8)], [(0, 8)], [(8, 16)], [(8, 16)]]
    assert kv.local_size(16, 4) == 8 and kv.local_size(16, 2) == 8
    gdn = TpShard(0, sections=(4, 4, 8), heads=(2, 2, 4))  # key heads replicated, value heads split
    assert gdn.ranges(16, 3, 4) == [(2, 4), (6, 8), (14, 16)]


@pytest.mark.parametrize("model_dir,tp", [(DENSE, 2), (MOE, 2), (DENSE, 4)], ids=["dense", "moe", "dense-tp4"])
def test_sharded_load_reads_this_ranks_slices(model_dir, tp):
    """Every tensor of every rank equals the matching slices of the full tensor (zero-padded vocab rows), and the
    ranks' pieces together are the whole tensor (heads fewer than ranks: each on tp / heads ranks)."""
    cfg = ModelConfig.from_model_dir(model_dir)
    specs = model_class(cfg).weight_specs(cfg)
    full = load_tensors(model_dir, specs, torch.float32, "cpu")
    shards = [load_tensors(model_dir, specs, torch.float32, "cpu", tp_rank=r, tp_size=tp) for r in range(tp)]
    sharded = 0
    for spec in specs:
        if spec.tp is None:
            assert all(torch.equal(s[spec.name], full[spec.name]) for s in shards)
            continue
        sharded += 1
        for r, s in enumerate(shards):
            dim = spec.tp.dim
            ranges = spec.tp.ranges(spec.shape[dim], r, tp)
            want = torch.cat([full[spec.name].narrow(dim, a, b - a) for a, b in ranges], dim)
            got = s[spec.name].narrow(dim, 0, want.shape[dim])
            assert torch.equal(got, want), spec.name
            assert s[spec.name].shape == spec.local_shape(r, tp)
    assert sharded > 10


def test_pipeline_stage_declares_only_its_layers():
    cfg = ModelConfig.from_model_dir(DENSE)
    from lightllm_mtp.config.parallel_config import RankInfo
    from lightllm_mtp.config.runtime import RuntimeShape

    def names(stage, draft=0):
        rt = RuntimeShape(torch.float32, torch.device("cpu"), 1, 8, 8, num_draft_tokens=draft,
                          rank=RankInfo(ParallelConfig(pp=2), stage))  # fmt: skip
        return {s.name for s in model_class(cfg).weight_specs(cfg, rt)}

    first, last, last_mtp = names(0), names(1), names(1, draft=2)
    assert any(".layers.3." in n for n in first) and not any(".layers.4." in n for n in first)
    assert any(".layers.4." in n for n in last) and not any(".layers.3." in n for n in last)
    assert any("embed_tokens" in n for n in first) and not any("embed_tokens" in n for n in last)
    assert "lm_head.weight" in last and "lm_head.weight" not in first
    assert any("embed_tokens" in n for n in last_mtp)  # the drafts on the last stage embed tokens


def test_step_ops_round_trip_as_json():
    from lightllm_mtp.engine.parallel.step_ops import (
        Collect, CompileGrammar, EvictAll, Launch, Match, NewRequest, Release, SaveState, Settle, Stop, Unmatch,
        decode_ops, encode_ops,
    )
    from lightllm_mtp.sampling_params import SamplingParams, StructuredOutput

    schema = StructuredOutput("json_schema", '{"type": "object"}', starts_after="</think>")

    ops = [
        Collect(3), Release(7, 0),
        Launch(4, 3, [(7, 1), (9, 32)], [NewRequest(9, [1, 2, 3], SamplingParams(temperature=0.7, top_k=5, seed=11,
                                                                                  stop_token_ids=[5, 2]), 11)]),
        SaveState("/tmp/x"), Stop(),
        Match(12, NewRequest(12, [4, 5], SamplingParams(max_new_tokens=3, cache_salt="tenant-a"), None)),
        Match(12, None), Unmatch(12),
        Release(12, 3), Settle(4), EvictAll(), Launch(5, None, [(12, 2)], [], [100, 20, 4, 3, 0, 2]),
        CompileGrammar.of(schema),
        Launch(6, None, [(13, 4)], [NewRequest(13, [1, 2, 3, 4], SamplingParams(structured=schema), None)]),
    ]  # fmt: skip
    data = encode_ops(ops)
    assert decode_ops(data) == ops and b"pickle" not in data
    steady = encode_ops([Collect(10), Launch(11, 10, [(i, 1) for i in range(32)], [], [100, 20, 4, 3, 0, 2])])
    assert len(steady) < 400  # a decode step of 32 requests
