"""benchmark/check_collectives.py over gloo on CPU: two real processes time the engine's tp collectives; the report
holds the command and a step's total as (2 x layers + 1) all-reduces + 1 logits all-gather."""

import json

import pytest

from benchmark import check_collectives


def test_collectives_report(tmp_path):
    out = tmp_path / "c.json"
    argv = ["--device", "cpu", "--tp", "2", "--rows", "1,3", "--iters", "2", "--model_shape", "qwen3.5-0.8b",
            "--out", str(out)]  # fmt: skip
    report = check_collectives.main(argv)
    assert json.loads(out.read_text()) == report
    assert report["command"] == "python benchmark/check_collectives.py " + " ".join(argv)
    assert report["backend"] == "gloo" and [r["rows"] for r in report["results"]] == [1, 3]
    for r in report["results"]:
        assert r["all_reduce_us"] > 0 and r["logits_all_gather_us"] > 0
        want = (2 * report["layers"] + 1) * r["all_reduce_us"] + r["logits_all_gather_us"]
        assert r["per_step_us"] == pytest.approx(want)


def test_one_rank_is_refused():
    with pytest.raises(SystemExit, match="--tp must be >= 2"):
        check_collectives.main(["--device", "cpu", "--tp", "1"])
