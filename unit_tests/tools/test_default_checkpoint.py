"""The main job's default: the shipped trained checkpoint when complete, else the cached random tiny one."""

import json

from lightllm_mtp.tools import default_checkpoint


def write_fake_checkpoint(model_dir, shards):
    model_dir.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json"):
        (model_dir / name).write_text("{}")
    weight_map = {f"w{i}": shard for i, shard in enumerate(shards)}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    for shard in shards:
        (model_dir / shard).write_bytes(b"x")


def test_trained_checkpoint_only_when_complete(tmp_path, monkeypatch):
    monkeypatch.setattr(default_checkpoint, "FIXTURES_DIR", tmp_path)
    monkeypatch.setattr(default_checkpoint, "ensure_tiny_checkpoint", lambda: tmp_path / "random")
    assert default_checkpoint.trained_checkpoint_dir("qwen3_5") is None
    assert default_checkpoint.default_model_dir() == tmp_path / "random"
    dense = tmp_path / default_checkpoint.TRAINED_CHECKPOINTS["qwen3_5"]
    write_fake_checkpoint(dense, ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"])
    assert default_checkpoint.trained_checkpoint_dir("qwen3_5") == dense
    assert default_checkpoint.default_model_dir() == dense
    (dense / "model-00002-of-00002.safetensors").unlink()  # a shard the index names is missing
    assert default_checkpoint.trained_checkpoint_dir("qwen3_5") is None
    assert default_checkpoint.default_model_dir() == tmp_path / "random"


def test_only_the_main_jobs_fixture_ships_in_the_package():
    """The runtime package holds the main job's trained checkpoint and its README; the tests' trained checkpoints live
    under fixtures/ at the repository root."""
    from unit_tests import trained_fixtures

    assert default_checkpoint.FIXTURES_DIR.name == "fixtures"
    assert default_checkpoint.FIXTURES_DIR.parent.name == "lightllm_mtp"
    assert (default_checkpoint.FIXTURES_DIR / "README.md").is_file()
    assert default_checkpoint.TRAINED_CHECKPOINTS == {"qwen3_5": "tiny_qwen3_5_trained"}
    shipped = {p.name for p in default_checkpoint.FIXTURES_DIR.iterdir() if p.is_dir()}
    assert shipped == {"tiny_qwen3_5_trained"}
    assert trained_fixtures.TEST_FIXTURES_DIR.parent == default_checkpoint.FIXTURES_DIR.parents[1]  # the repository
    assert set(trained_fixtures.TEST_CHECKPOINTS) == {"qwen3_5_moe", "qwen3_5_mtp3_ptd", "qwen3_5_draft",
                                                      "qwen3_5_draft_pard"}
    for name in trained_fixtures.TEST_CHECKPOINTS:
        assert trained_fixtures.trained_fixture(name) == trained_fixtures.TEST_FIXTURES_DIR / \
            trained_fixtures.TEST_CHECKPOINTS[name]
    assert trained_fixtures.trained_fixture("qwen3_5") == default_checkpoint.FIXTURES_DIR / "tiny_qwen3_5_trained"
