"""CPU smoke test of benchmark/draft_cost.py on a tiny random shape: every mode and k lands in the JSON, with the
speedup at a given acceptance."""

import json

from benchmark import draft_cost
from benchmark.model_shapes import MODEL_SHAPES
from unit_tests.benchmark.test_static_inference_cpu import TINY_MOE_SHAPE


def test_every_mode_and_k_is_timed(monkeypatch, tmp_path):
    monkeypatch.setitem(MODEL_SHAPES, "tiny-moe-test", TINY_MOE_SHAPE)
    acceptance = tmp_path / "acc.json"
    acceptance.write_text(json.dumps({"by_mode": {"ptd": {"2": {"tokens_per_step": 2.0,
                                                                "acceptance_per_position": [0.8, 0.5]}}}}))
    out = tmp_path / "cost.json"
    report = draft_cost.main(["--model_shape", "tiny-moe-test", "--device", "cpu", "--input_len", "16",
                              "--output_len", "12", "--ks", "1,2", "--acceptance", str(acceptance),
                              "--out", str(out)])  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["command"].startswith("python benchmark/draft_cost.py ")
    rows = {(r["mode"], r["k"]): r for r in report["results"]}
    assert set(rows) == {(m, k) for m in ("eagle_with_att", "vanilla_with_att", "ptd") for k in (1, 2)}
    assert report["decode_step_ms"] > 0
    for (mode, k), r in rows.items():
        assert r["steps_timed"] > 0 and r["draft_ms"] > 0 and r["step_cost"] > 0
        expected = {"eagle_with_att": k, "vanilla_with_att": k, "ptd": 1}[mode]
        assert r["draft_forwards_per_step"] == expected, (mode, k)
    (speedup,) = report["speedup_at_measured_acceptance"]
    assert speedup["mode"] == "ptd" and speedup["speedup"] == 2.0 / rows[("ptd", 2)]["step_cost"]


def test_reduced_draft_vocabulary_is_timed_beside_the_full_one(monkeypatch, tmp_path):
    monkeypatch.setitem(MODEL_SHAPES, "tiny-moe-test", TINY_MOE_SHAPE)
    report = draft_cost.main(["--model_shape", "tiny-moe-test", "--device", "cpu", "--input_len", "16",
                              "--output_len", "10", "--ks", "1", "--modes", "eagle_with_att", "--draft_vocab_sizes",
                              "0,64", "--out", str(tmp_path / "cost.json")])  # fmt: skip
    assert [r["draft_vocab_size"] for r in report["results"]] == [TINY_MOE_SHAPE["vocab_size"], 64]
    assert all(r["draft_ms"] > 0 for r in report["results"])


def test_draft_model_and_pard_are_timed(monkeypatch, tmp_path):
    """An external draft at a smaller shape (random weights): a window pass then k-1 chain steps autoregressively,
    one window pass with PARD."""
    monkeypatch.setitem(MODEL_SHAPES, "tiny-moe-test", TINY_MOE_SHAPE)
    small = dict(TINY_MOE_SHAPE, num_hidden_layers=4, hidden_size=TINY_MOE_SHAPE["hidden_size"] // 2)
    monkeypatch.setitem(MODEL_SHAPES, "tiny-draft-test", small)
    report = draft_cost.main(["--model_shape", "tiny-moe-test", "--draft_shape", "tiny-draft-test", "--device", "cpu",
                              "--input_len", "16", "--output_len", "10", "--ks", "1,3", "--modes", "draft_model,pard",
                              "--out", str(tmp_path / "cost.json")])  # fmt: skip
    rows = {(r["mode"], r["k"]): r for r in report["results"]}
    assert set(rows) == {(m, k) for m in ("draft_model", "pard") for k in (1, 3)}
    for (mode, k), r in rows.items():
        assert r["draft_ms"] > 0 and r["draft_forwards_per_step"] == (k if mode == "draft_model" else 1), (mode, k)
    assert report["model"]["draft_shape"] == "tiny-draft-test"
