"""CPU smoke test of benchmark/static_inference.py on tiny models: every figure lands in the JSON."""

import json
import math

import pytest

from benchmark import static_inference
from benchmark.floor import spec_bytes
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.models.registry import model_class

TINY_MOE_SHAPE = {
    "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
    "vocab_size": 512, "hidden_size": 32, "num_hidden_layers": 4, "full_attention_interval": 4,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
    "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
    "partial_rotary_factor": 0.25}, "attn_output_gate": True, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096, "mtp_num_hidden_layers": 1, "hidden_act": "silu",
    "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16,
    "tie_word_embeddings": False,
}  # fmt: skip


def _run(tmp_path, *argv):
    out = tmp_path / "x.json"
    report = static_inference.main([*argv, "--device", "cpu", "--out", str(out), "--bw_repeats", "3"])
    on_disk = json.loads(out.read_text())
    assert on_disk["command"] == report["command"]
    return on_disk


def _check_common(r, batch_sizes, output_len):
    assert r["command"].startswith("python benchmark/static_inference.py ")
    assert r["device"]["type"] == "cpu"
    assert "CPU memcpy" in r["bandwidth"]["method"] and r["bandwidth"]["bytes_per_s"] > 0
    assert set(r["versions"]) >= {"torch", "triton", "transformers"}
    assert [x["batch_size"] for x in r["results"]] == batch_sizes
    cfg = ModelConfig.from_hf(r["model"]["hf_config"])
    specs = model_class(cfg).weight_specs(cfg)
    assert r["model"]["weight_bytes"] == sum(spec_bytes(s, __import__("torch").float32) for s in specs)
    for x in r["results"]:
        bs = x["batch_size"]
        assert x["prefill"]["ms"] > 0 and x["prefill"]["forwards"] >= 1
        assert x["prefill"]["tokens_per_s"] == pytest.approx(x["prefill"]["prompt_tokens"] / x["prefill"]["ms"] * 1e3)
        d = x["decode"]
        assert d["n"] >= 1 and d["p10_ms"] <= d["median_ms"] <= d["p90_ms"]
        assert d["tokens_per_s"] == pytest.approx(bs / d["median_ms"] * 1e3)
        f = x["floor"]
        assert f["bytes_per_step"] == pytest.approx(f["breakdown"]["total"])
        assert f["floor_ms"] == pytest.approx(f["bytes_per_step"] / r["bandwidth"]["bytes_per_s"] * 1e3)
        assert f["pct_of_floor"] == pytest.approx(f["floor_ms"] / d["median_ms"] * 100)
        assert x["e2e"]["output_tokens_per_s"] == pytest.approx(bs * output_len / x["e2e"]["ms"] * 1e3)
    return cfg


def test_checkpoint_dir_with_hf_peer(tiny_dense_dir, tmp_path):
    r = _run(tmp_path, "--model_dir", str(tiny_dense_dir), "--batch_sizes", "1,2", "--input_len", "8",
             "--output_len", "4", "--hf_peer", "--hf_batch_sizes", "1,2")  # fmt: skip
    _check_common(r, [1, 2], 4)
    assert "mtp" not in r
    runs = r["hf_peer"]["runs"]
    assert [x["batch_size"] for x in runs] == [1, 2]
    for x in runs:
        assert "error" not in x, x
        assert x["e2e_output_tokens_per_s"] > 0 and x["speedup_e2e"] > 0 and x["speedup_decode"] > 0
        assert x["greedy_tokens_equal_frac"] == 1.0  # same fp32 weights, same greedy tokens as HF


def test_mtp_simulation(tiny_dense_dir, tmp_path):
    r = _run(tmp_path, "--model_dir", str(tiny_dense_dir), "--batch_sizes", "1,2", "--input_len", "8",
             "--output_len", "10", "--mtp_mode", "eagle_with_att", "--mtp_step", "2",
             "--mtp_accept_rate", "0.5,1.0")  # fmt: skip
    _check_common(r, [1, 2], 10)
    m = r["mtp"]
    assert m["mode"] == "eagle_with_att" and m["mtp_step"] == 2
    for x in m["results"]:
        assert x["spec_step"]["n"] >= 1
        assert x["verify_ms"] > 0 and x["draft_ms"] > 0
        assert x["draft_forwards_per_step"] == 2  # one draft pass + one eagle chain step
        assert x["step_cost_vs_decode"] > 0
        sims = {s["accept_rate"]: s for s in x["simulated"]}
        assert sims[0.5]["tokens_per_step"] == pytest.approx(1.75) and sims[1.0]["tokens_per_step"] == 3
        base = next(b for b in r["results"] if b["batch_size"] == x["batch_size"])
        s = sims[1.0]
        assert s["effective_tokens_per_s"] == pytest.approx(x["batch_size"] * 3 / x["spec_step"]["median_ms"] * 1e3)
        assert s["speedup_vs_no_spec"] == pytest.approx(s["effective_tokens_per_s"] / base["decode"]["tokens_per_s"])


def test_forced_acceptance_on_random_weights(tiny_dense_dir, tmp_path, capsys):
    """--mtp_force_acceptance reaches the engine: the timed steps of random weights accept drafts (they otherwise
    accept almost none) and the 'forced' figures are computed from them."""
    r = _run(tmp_path, "--model_dir", str(tiny_dense_dir), "--batch_sizes", "2", "--input_len", "8",
             "--output_len", "40", "--mtp_mode", "eagle_with_att", "--mtp_step", "2",
             "--mtp_force_acceptance", "1,1")  # fmt: skip
    assert r["mtp"]["forced_acceptance"] == "1,1"
    x = r["mtp"]["results"][0]
    f = x["forced"]
    assert x["observed_accepted_drafts_per_step"] == 2.0 and f["tokens_per_step"] == 3.0  # every draft, by force
    assert f["effective_tokens_per_s"] == pytest.approx(2 * 3 / x["spec_step"]["median_ms"] * 1e3)
    assert "forced acceptance 1,1 (drafts unchecked): 3.000 tok/step" in capsys.readouterr().out


def test_forced_acceptance_is_checked_before_anything_runs(capsys):
    for argv, message in [(["--mtp_force_acceptance", "mean=2"], "needs --mtp_mode"),
                          (["--mtp_mode", "eagle_with_att", "--mtp_step", "2", "--mtp_force_acceptance", "mean=3.5"],
                           "must be in [1, 3] for mtp_step 2")]:  # fmt: skip
        with pytest.raises(SystemExit):
            static_inference.parse_args(["--model_shape", "qwen3.5-27b", *argv])
        assert message in capsys.readouterr().err


def test_random_weight_shape_moe(monkeypatch, tmp_path):
    monkeypatch.setitem(static_inference.MODEL_SHAPES, "tiny-moe-test", TINY_MOE_SHAPE)
    r = _run(tmp_path, "--model_shape", "tiny-moe-test", "--batch_sizes", "1,2", "--input_len", "8",
             "--output_len", "4", "--hf_peer", "--hf_batch_sizes", "2,3")  # fmt: skip
    _check_common(r, [1, 2], 4)
    assert r["model"]["source"].startswith("random weights")
    one, two = (x["floor"]["breakdown"]["experts_per_layer"] for x in r["results"])
    assert one == pytest.approx(2) and two == pytest.approx(8 * (1 - (1 - 2 / 8) ** 2))
    runs = {x["batch_size"]: x for x in r["hf_peer"]["runs"]}
    assert "error" not in runs[2] and runs[2]["speedup_e2e"] > 0
    assert "speedup_note" in runs[3]  # no engine run at bs=3 to compare with


def test_hf_failure_is_reported_not_raised(monkeypatch, tiny_dense_dir, tmp_path):
    def broken(*a, **k):
        raise RuntimeError("no HF today")

    monkeypatch.setattr(static_inference, "build_hf_model", broken)
    r = _run(tmp_path, "--model_dir", str(tiny_dense_dir), "--batch_sizes", "1", "--input_len", "4",
             "--output_len", "3", "--hf_peer")  # fmt: skip
    assert "no HF today" in r["hf_peer"]["error"]
    assert r["results"][0]["decode"]["median_ms"] > 0


def test_break_even_rate():
    k = 3
    assert static_inference.break_even_rate(0.9, k) == 0.0
    assert static_inference.break_even_rate(k + 1.5, k) is None
    rate = static_inference.break_even_rate(2.0, k)
    assert static_inference.tokens_per_step(rate, k) == pytest.approx(2.0)
    assert math.isclose(static_inference.tokens_per_step(0.5, 2), 1.75)


def test_real_acceptance_on_the_trained_checkpoint(tmp_path, trained_dense_dir):
    """--real_acceptance measures k=1..4 on held-out text and turns the k under test into a real speedup row."""
    r = _run(tmp_path, "--model_dir", str(trained_dense_dir), "--batch_sizes", "1", "--input_len", "16",
             "--output_len", "12", "--mtp_mode", "eagle_with_att", "--mtp_step", "1", "--real_acceptance")  # fmt: skip
    real = r["real_acceptance"]["mtp"]
    assert sorted(real) == ["1", "2", "3", "4"] and all(m["greedy_equal"] for m in real.values())
    assert [len(real[k]["acceptance_per_position"]) for k in "1234"] == [1, 2, 3, 4]
    assert real["1"]["acceptance_per_position"][0] >= 0.6  # the held-out target
    row = r["mtp"]["results"][0]["real"]
    assert row["tokens_per_step"] == real["1"]["tokens_per_step"] and row["effective_tokens_per_s"] > 0


def test_real_acceptance_needs_a_checkpoint():
    with pytest.raises(SystemExit):
        static_inference.parse_args(["--model_shape", "qwen3.5-27b", "--mtp_mode", "eagle_with_att", "--real_acceptance"])


def test_pipeline_and_tensor_parallel_report_the_floor_per_gpu(tiny_dense_dir, tmp_path):
    """tp=2 x pp=2 over gloo (4 CPU processes): the decode and verify results carry each stage's GPU bytes, the
    step's floor (the stages in sequence) and each GPU's busy share."""
    r = _run(tmp_path, "--model_dir", str(tiny_dense_dir), "--batch_sizes", "1", "--input_len", "8", "--output_len",
             "6", "--tp", "2", "--pp", "2", "--mtp_mode", "eagle_with_att", "--mtp_step", "1")  # fmt: skip
    x = r["results"][0]
    g = x["floor_per_gpu"]
    assert (g["tp"], g["pp"]) == (2, 2) and len(g["stage_bytes_per_gpu"]) == 2
    assert sum(g["stage_bytes_per_gpu"]) < x["floor"]["bytes_per_step"]  # tp shards
    assert g["floor_ms"] == pytest.approx(sum(g["stage_bytes_per_gpu"]) / r["bandwidth"]["bytes_per_s"] * 1e3)
    assert g["pct_of_floor"] == pytest.approx(g["floor_ms"] / x["decode"]["median_ms"] * 100)
    v = r["mtp"]["results"][0]["verify_floor_per_gpu"]
    assert v["pct_of_floor"] == pytest.approx(v["floor_ms"] / r["mtp"]["results"][0]["verify_ms"] * 100)


def test_fp8_weights_and_kv_reach_the_floor(fp8_dense_dir, tmp_path):
    """An -FP8 checkpoint with --kv_cache_dtype fp8: the engine runs it, the weight bytes and the floor count the
    FP8 projections (one byte an element, plus scales) and one-byte KV."""
    r = _run(tmp_path, "--model_dir", str(fp8_dense_dir), "--batch_sizes", "2", "--input_len", "8", "--output_len",
             "12", "--kv_cache_dtype", "fp8", "--mtp_mode", "eagle_with_att", "--mtp_step", "1")  # fmt: skip
    cfg = ModelConfig.from_hf(r["model"]["hf_config"])
    specs = model_class(cfg).weight_specs(cfg)
    assert cfg.quantization is not None
    assert r["model"]["weight_bytes"] == sum(spec_bytes(s, __import__("torch").float32, quant=cfg.quantization)
                                             for s in specs)  # fmt: skip
    assert r["model"]["weight_bytes"] < 0.5 * sum(spec_bytes(s, __import__("torch").float32) for s in specs)
    assert r["settings"]["engine_args"]["kv_cache_dtype"] == "fp8"
    b = r["results"][0]["floor"]["breakdown"]
    kv_layers, heads, head_dim = len(cfg.full_attention_layers), cfg.num_key_value_heads, cfg.head_dim
    assert b["kv_cache"] == pytest.approx(2 * heads * head_dim * kv_layers * r["results"][0]["floor"]["mean_context"]
                                          * 2, rel=1e-6)  # fmt: skip
    assert r["mtp"]["results"][0]["verify_floor"]["bytes"] > 0, r["mtp"]["results"][0]
