"""benchmark/long_context.py on the tiny model (CPU): a real prefill and a synthetic context past the native window
(YaRN picked automatically), decode and MTP steps at each length, the attention kernel's chunk timing, and adaptive
k's table and choices in the report."""

import json

from benchmark.long_context import main


def test_plain_run_reports_every_length(tiny_dense_dir, tmp_path):
    out = tmp_path / "plain.json"
    report = main(["--model_dir", str(tiny_dense_dir), "--device", "cpu", "--lengths", "512,5000", "--real_prefill",
                   "512", "--chunk", "256", "--decode_steps", "4", "--out", str(out)])  # fmt: skip
    assert json.loads(out.read_text())["command"].startswith("python benchmark/long_context.py")
    assert report["settings"]["rope_scaling"] == {"rope_type": "yarn", "factor": 2,
                                                  "original_max_position_embeddings": 4096}  # fmt: skip
    real, synthetic = report["lengths"]
    assert real["prefill"]["forwards"] == 2 and real["prefill"]["tokens_per_s"] > 0
    assert synthetic["synthetic_context"] and synthetic["last_chunk"]["forwards"] == 1
    for row in report["lengths"]:
        assert row["decode"]["n"] >= 3 and row["decode"]["kv_bytes"] > 0
    assert synthetic["decode"]["kv_bytes"] > real["decode"]["kv_bytes"]
    assert [r["length"] for r in report["attention_kernel"]] == [512, 5000]


def test_mtp_adaptive_run_reports_steps_and_choices(tiny_dense_dir, tmp_path):
    report = main(["--model_dir", str(tiny_dense_dir), "--device", "cpu", "--lengths", "600,2000", "--chunk", "256",
                   "--decode_steps", "3", "--mtp_mode", "eagle_with_att", "--mtp_step", "2", "--mtp_adaptive",
                   "--mtp_force_acceptance", "mean=2", "--skip_attention_kernel", "--out",
                   str(tmp_path / "mtp.json")])  # fmt: skip
    assert all(row["mtp_step"]["n"] >= 1 and row["tokens_per_step"] >= 1 for row in report["lengths"])
    adaptive = report["adaptive"]
    assert adaptive["ms_per_context_token_by_k"] is not None
    assert {(c["accept_rate"], c["length"]) for c in adaptive["choices"]} == {(a, n) for a in (0.8, 0.6)
                                                                              for n in (600, 2000)}  # fmt: skip
