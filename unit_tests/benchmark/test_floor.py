"""HBM-floor byte counts (benchmark/floor.py) against hand counts for tiny configs and the engine's own caches."""

import pytest
import torch

from benchmark.floor import expected_distinct_experts, parallel_floor, prefill_gemm_flops, stage_bytes, step_bytes
from lightllm_mtp.common.kv_pool import KvPool
from lightllm_mtp.common.linear_att_state import LinearAttState
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.models.registry import model_class

# 4 layers: GDN, GDN, GDN, full attention. Hand-count constants below follow these numbers.
V, H, HEADS, HKV, D, NK, NV, DK, DV, K, INTER = 100, 16, 2, 1, 8, 1, 2, 4, 4, 4, 24
BASE = {
    "vocab_size": V, "hidden_size": H, "num_hidden_layers": 4, "full_attention_interval": 4,
    "num_attention_heads": HEADS, "num_key_value_heads": HKV, "head_dim": D,
    "linear_num_key_heads": NK, "linear_num_value_heads": NV, "linear_key_head_dim": DK,
    "linear_value_head_dim": DV, "linear_conv_kernel_dim": K, "attn_output_gate": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25},
    "tie_word_embeddings": False,
}  # fmt: skip
DENSE = {**BASE, "architectures": ["Qwen3_5ForCausalLM"], "intermediate_size": INTER}
E, TOPK, MOE_I, SHARED_I = 8, 2, 6, 10
MOE = {
    **BASE, "architectures": ["Qwen3_5MoeForCausalLM"], "num_experts": E, "num_experts_per_tok": TOPK,
    "moe_intermediate_size": MOE_I, "shared_expert_intermediate_size": SHARED_I,
}  # fmt: skip
BF16 = 2
CONV_DIM = 2 * NK * DK + NV * DV  # 16
GDN_BF16 = CONV_DIM * H + NV * DV * H + 2 * NV * H + CONV_DIM * K + DV + H * NV * DV  # qkv, z, b+a, conv, norm, out
GDN_FP32 = 2 * NV  # A_log, dt_bias
ATTN = HEADS * D * 2 * H + 2 * HKV * D * H + H * HEADS * D + 2 * D  # q(+gate), k, v, o, q/k norms
NORMS = 2 * H  # per layer


def _specs(cfg):
    return model_class(cfg).weight_specs(cfg)


def _numel(spec):
    n = 1
    for d in spec.shape:
        n *= d
    return n


def test_dense_weight_bytes_hand_count():
    cfg = ModelConfig.from_hf(DENSE)
    mlp = 3 * H * INTER
    per_layer = NORMS + mlp
    hand = BF16 * (H + V * H + 4 * per_layer + 3 * GDN_BF16 + ATTN) + 4 * 3 * GDN_FP32  # final norm, lm_head
    b = step_bytes(cfg, _specs(cfg), torch.bfloat16, batch_size=3, context_len=10)
    assert b.weights == hand
    assert b.embedding_rows == 3 * H * BF16
    assert b.routed_experts == 0 and b.experts_per_layer is None
    # equals the declared TensorSpecs, with the embedding matrix replaced by the rows read
    specs = _specs(cfg)
    declared = sum(_numel(s) * (4 if s.keep_fp32 else BF16) for s in specs)
    assert b.weights + b.embedding_rows == declared - V * H * BF16 + 3 * H * BF16


def test_tied_embedding_is_read_once_as_lm_head():
    cfg = ModelConfig.from_hf({**DENSE, "tie_word_embeddings": True})
    untied = ModelConfig.from_hf(DENSE)
    tied_b = step_bytes(cfg, _specs(cfg), torch.bfloat16, 2, 10)
    untied_b = step_bytes(untied, _specs(untied), torch.bfloat16, 2, 10)
    assert tied_b.embedding_rows == 0
    assert tied_b.weights == untied_b.weights  # the shared matrix replaces lm_head.weight


def test_kv_and_linear_state_bytes():
    cfg = ModelConfig.from_hf(DENSE)
    bs, ctx = 5, 37
    b = step_bytes(cfg, _specs(cfg), torch.bfloat16, bs, ctx)
    assert b.kv_cache == 1 * 2 * HKV * D * BF16 * ctx * bs  # one full-attention layer
    ssm = NV * DK * DV * 4
    conv = CONV_DIM * (K - 1) * BF16
    assert b.linear_state == 3 * bs * (2 * ssm + 2 * conv)  # three GDN layers, read + write
    # the same numbers from the engine's own cache objects
    state = LinearAttState(3, 1, CONV_DIM, K, NV, DK, DV, torch.bfloat16, torch.device("cpu"))
    assert b.linear_state == 2 * state.bytes_per_slot() * bs
    pool = KvPool(1, 4, HKV, D, torch.bfloat16, torch.device("cpu"))
    per_token = (pool.k_buffer[0, 0].numel() + pool.v_buffer[0, 0].numel()) * pool.k_buffer.element_size()
    assert b.kv_cache == per_token * ctx * bs


def test_verify_rows_widen_state_and_expert_count():
    cfg = ModelConfig.from_hf(MOE)
    k = 2
    b = step_bytes(cfg, _specs(cfg), torch.bfloat16, batch_size=3, context_len=20, rows_per_req=k + 1)
    ssm = NV * DK * DV * 4
    conv = CONV_DIM * (K - 1 + k) * BF16
    assert b.linear_state == 3 * 3 * (ssm * (k + 2) + 2 * conv)  # one row read, k+1 rows written
    state = LinearAttState(3, 1, CONV_DIM, K, NV, DK, DV, torch.bfloat16, torch.device("cpu"), num_draft_tokens=k)
    assert state.conv[:, 0].numel() * BF16 == 3 * conv
    assert b.experts_per_layer == pytest.approx(expected_distinct_experts(E, TOPK, 9))


def test_moe_routed_experts():
    cfg = ModelConfig.from_hf(MOE)
    per_expert = (2 * MOE_I * H + H * MOE_I) * BF16
    one = step_bytes(cfg, _specs(cfg), torch.bfloat16, 1, 10)
    assert one.experts_per_layer == pytest.approx(TOPK)
    assert one.routed_experts == pytest.approx(4 * TOPK * per_expert)
    many = step_bytes(cfg, _specs(cfg), torch.bfloat16, 1000, 10)
    assert many.routed_experts == pytest.approx(4 * E * per_expert)
    shared = 3 * H * SHARED_I + H + E * H  # shared expert, its gate, router
    hand = BF16 * (H + V * H + 4 * (NORMS + shared) + 3 * GDN_BF16 + ATTN) + 4 * 3 * GDN_FP32
    assert one.weights == hand


def test_expected_distinct_experts():
    assert expected_distinct_experts(256, 8, 1) == pytest.approx(8)
    assert expected_distinct_experts(8, 2, 2) == pytest.approx(8 * (1 - 0.75**2))
    values = [expected_distinct_experts(256, 8, n) for n in (1, 2, 8, 32, 128, 1024)]
    assert values == sorted(values) and values[-1] < 256
    # Monte Carlo: N tokens, each picking k distinct experts uniformly
    gen = torch.Generator().manual_seed(0)
    n_tokens, trials = 4, 4000
    picks = torch.rand(trials, n_tokens, E, generator=gen).argsort(dim=-1)[..., :TOPK]
    hit = torch.zeros(trials, E, dtype=torch.bool).scatter_(1, picks.reshape(trials, -1), True)
    assert hit.sum(1).float().mean().item() == pytest.approx(expected_distinct_experts(E, TOPK, n_tokens), rel=0.02)


@pytest.mark.parametrize("moe", [False, True])
def test_prefill_gemm_flops_hand_count(moe):
    """2 * tokens * the projection weights a token multiplies: GDN in/out projections, attention q/k/v/o, the MLP (of
    the routed experts top_k of E, the router and the shared expert with its gate in full); no embedding, lm_head,
    norms or conv."""
    cfg = ModelConfig.from_hf(MOE if moe else DENSE)
    gdn = CONV_DIM * H + NV * DV * H + 2 * NV * H + H * NV * DV
    attn = HEADS * D * 2 * H + 2 * HKV * D * H + H * HEADS * D
    if moe:
        mlp = E * H + TOPK * 3 * H * MOE_I + 3 * H * SHARED_I + H  # router, top-k experts, shared expert + its gate
    else:
        mlp = 3 * H * INTER
    tokens = 37
    assert prefill_gemm_flops(cfg, _specs(cfg), tokens) == 2 * tokens * (3 * gdn + attn + 4 * mlp)


@pytest.mark.parametrize("moe", [False, True])
def test_one_gpu_stage_bytes_equal_the_step_bytes(moe):
    cfg = ModelConfig.from_hf(MOE if moe else DENSE)
    (one,) = stage_bytes(cfg, model_class(cfg), torch.bfloat16, 3, 20, 2)
    assert one == step_bytes(cfg, _specs(cfg), torch.bfloat16, 3, 20, 2)


@pytest.mark.parametrize("config", ["dense", "moe", "tied"])
def test_pipeline_stages_split_the_step(config):
    """pp=2: the two stages' bytes add up to the whole step's (the embedding rows on the first stage, final norm and
    lm_head on the last, the layers split); a tied matrix is read once, by the lm_head on the last stage."""
    cfg = ModelConfig.from_hf({"dense": DENSE, "moe": MOE, "tied": {**DENSE, "tie_word_embeddings": True}}[config])
    whole = step_bytes(cfg, _specs(cfg), torch.bfloat16, 3, 20)
    first, last = stage_bytes(cfg, model_class(cfg), torch.bfloat16, 3, 20, pp=2)
    for field in ("weights", "routed_experts", "kv_cache", "linear_state"):  # the tied matrix too: counted once
        assert getattr(first, field) + getattr(last, field) == pytest.approx(getattr(whole, field)), field
    assert first.kv_cache == 0 and last.kv_cache == whole.kv_cache  # the full-attention layer is layer 3
    if config == "tied":  # one GPU: the rows are inside the matrix the lm_head reads; two: stage 0 reads them
        assert whole.embedding_rows == 0 and first.embedding_rows == 3 * H * BF16 and last.embedding_rows == 0
    else:
        assert first.embedding_rows == whole.embedding_rows and last.embedding_rows == 0


def test_tensor_parallel_gpu_share():
    """tp=2 of the tiny MoE config: shards at their local shapes (test_parallel_layout checks those against the
    loader), the routed experts halved (I split), the one KV head and the one GDN key head replicated, the GDN value
    heads split."""
    cfg = ModelConfig.from_hf(MOE)
    whole = step_bytes(cfg, _specs(cfg), torch.bfloat16, 3, 20)
    (half,) = stage_bytes(cfg, model_class(cfg), torch.bfloat16, 3, 20, tp=2)
    assert half.routed_experts == pytest.approx(whole.routed_experts / 2)
    assert half.kv_cache == whole.kv_cache
    conv_local = 2 * NK * DK + (NV // 2) * DV
    assert half.linear_state == 3 * 3 * (2 * (NV // 2) * DK * DV * 4 + 2 * conv_local * (K - 1) * BF16)
    assert half.embedding_rows == whole.embedding_rows // 2
    local = sum(_numel_local(s, 2) * (4 if s.keep_fp32 else BF16) for s in _specs(cfg)
                if "embed_tokens" not in s.name and not s.name.endswith(("experts.gate_up_proj", "experts.down_proj")))
    assert half.weights == local and whole.weights / 2 < half.weights < whole.weights


def test_parallel_floor_sums_the_stages():
    cfg = ModelConfig.from_hf(DENSE)
    stages = stage_bytes(cfg, model_class(cfg), torch.bfloat16, 2, 10, tp=2, pp=2)
    f = parallel_floor(cfg, model_class(cfg), torch.bfloat16, 2, 10, step_ms=2.0, bandwidth_bytes_per_s=1e9, tp=2,
                       pp=2)  # fmt: skip
    assert f["stage_bytes_per_gpu"] == [s.total for s in stages]
    assert f["floor_ms"] == pytest.approx(sum(s.total for s in stages) / 1e9 * 1e3)
    assert f["pct_of_floor"] == pytest.approx(f["floor_ms"] / 2.0 * 100)
    assert sum(f["gpu_busy_pct"]) == pytest.approx(f["pct_of_floor"])


def _numel_local(spec, tp):
    n = 1
    for d in spec.local_shape(0, tp):
        n *= d
    return n
