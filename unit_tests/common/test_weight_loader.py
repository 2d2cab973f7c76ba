import json

import pytest
import torch
from safetensors.torch import save_file

from lightllm_mtp.common.tensor_spec import TensorSpec
from lightllm_mtp.common.weight_loader import WeightLoadError, load_tensors


def write_sharded(tmp_path, shards: dict[str, dict[str, torch.Tensor]]):
    weight_map = {}
    for fname, tensors in shards.items():
        save_file(tensors, str(tmp_path / fname))
        weight_map.update({n: fname for n in tensors})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_load_casts_and_keeps_fp32(tmp_path):
    a, b = torch.randn(4, 3), torch.randn(5)
    write_sharded(tmp_path, {"model-00001-of-00002.safetensors": {"a": a}, "model-00002-of-00002.safetensors": {"b": b}})
    out = load_tensors(tmp_path, [TensorSpec("a", (4, 3)), TensorSpec("b", (5,), keep_fp32=True)], torch.bfloat16, "cpu")
    assert out["a"].dtype == torch.bfloat16 and torch.equal(out["a"], a.bfloat16())
    assert out["b"].dtype == torch.float32 and torch.equal(out["b"], b)


def test_single_file_checkpoint(tmp_path):
    save_file({"x": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    assert load_tensors(tmp_path, [TensorSpec("x", (2,))], torch.float32, "cpu")["x"].sum() == 2


def test_missing_tensors_are_all_named(tmp_path):
    write_sharded(tmp_path, {"s.safetensors": {"a": torch.zeros(1)}})
    with pytest.raises(WeightLoadError, match="missing tensors: b, c"):
        load_tensors(tmp_path, [TensorSpec("a", (1,)), TensorSpec("b", (1,)), TensorSpec("c", (1,))], torch.float32, "cpu")


def test_misshaped_tensors_are_named_with_shapes(tmp_path):
    write_sharded(tmp_path, {"s.safetensors": {"a": torch.zeros(2, 3), "b": torch.zeros(4)}})
    with pytest.raises(WeightLoadError, match=r"a: expected shape \(3, 2\), found \(2, 3\)"):
        load_tensors(tmp_path, [TensorSpec("a", (3, 2)), TensorSpec("b", (4,))], torch.float32, "cpu")


def test_no_checkpoint_files(tmp_path):
    with pytest.raises(WeightLoadError, match="no model.safetensors"):
        load_tensors(tmp_path, [TensorSpec("a", (1,))], torch.float32, "cpu")


def test_per_expert_tensors_stack_into_fused_spec(tmp_path):
    gate = [torch.randn(2, 3) for _ in range(2)]
    up = [torch.randn(2, 3) for _ in range(2)]
    tensors = {f"e.{i}.gate": gate[i] for i in range(2)} | {f"e.{i}.up": up[i] for i in range(2)}
    write_sharded(tmp_path, {"s.safetensors": tensors})
    spec = TensorSpec("e.gate_up", (2, 4, 3), stacked_from=(("e.0.gate", "e.0.up"), ("e.1.gate", "e.1.up")))
    out = load_tensors(tmp_path, [spec], torch.float32, "cpu")["e.gate_up"]
    assert torch.equal(out[1], torch.cat([gate[1], up[1]]))


PER_EXPERT = TensorSpec("e.gate_up", (2, 4, 3), stacked_from=(("e.0.gate", "e.0.up"), ("e.1.gate", "e.1.up")))


def test_missing_per_expert_part_is_named(tmp_path):
    tensors = {"e.0.gate": torch.randn(2, 3), "e.0.up": torch.randn(2, 3), "e.1.gate": torch.randn(2, 3)}
    write_sharded(tmp_path, {"s.safetensors": tensors})
    with pytest.raises(WeightLoadError, match=r"e\.gate_up \(per-expert parts missing: e\.1\.up\)"):
        load_tensors(tmp_path, [PER_EXPERT], torch.float32, "cpu")


@pytest.mark.parametrize("bad_shape", [(2, 5), (3, 3)])
def test_misshaped_per_expert_part_is_named(tmp_path, bad_shape):
    tensors = {"e.0.gate": torch.randn(2, 3), "e.0.up": torch.randn(2, 3), "e.1.gate": torch.randn(2, 3)}
    tensors["e.1.up"] = torch.randn(*bad_shape)
    write_sharded(tmp_path, {"s.safetensors": tensors})
    with pytest.raises(WeightLoadError, match=rf"e\.1\.up: expected shape \(2, 3\), found \({bad_shape[0]}, {bad_shape[1]}\)"):
        load_tensors(tmp_path, [PER_EXPERT], torch.float32, "cpu")


def _one_shard(tmp_path):
    write_sharded(tmp_path, {"model-1.safetensors": {"a": torch.randn(64, 64)}})
    return tmp_path / "model-1.safetensors"


def test_truncated_shard_names_the_file(tmp_path):
    shard = _one_shard(tmp_path)
    shard.write_bytes(shard.read_bytes()[:-4096])
    with pytest.raises(WeightLoadError, match="model-1.safetensors: cannot read"):
        load_tensors(tmp_path, [TensorSpec("a", (64, 64))], torch.float32, "cpu")


def test_garbage_shard_names_the_file(tmp_path):
    shard = _one_shard(tmp_path)
    shard.write_bytes(b"\x00not a safetensors file" * 10)
    with pytest.raises(WeightLoadError, match="model-1.safetensors: cannot read this safetensors file"):
        load_tensors(tmp_path, [TensorSpec("a", (64, 64))], torch.float32, "cpu")


@pytest.mark.parametrize("index", ['{"metadata": {}}', "{not json", '{"weight_map": [1, 2]}'])
def test_broken_index_names_the_file(tmp_path, index):
    _one_shard(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(WeightLoadError, match="model.safetensors.index.json: not a safetensors index"):
        load_tensors(tmp_path, [TensorSpec("a", (64, 64))], torch.float32, "cpu")


def test_shard_missing_from_disk_names_the_file(tmp_path):
    _one_shard(tmp_path).unlink()
    with pytest.raises(WeightLoadError, match="model-1.safetensors: shard named by the index not found"):
        load_tensors(tmp_path, [TensorSpec("a", (64, 64))], torch.float32, "cpu")


@pytest.mark.parametrize("text", ["{oops", "[1, 2]", "\xff\xfe"])
def test_invalid_config_json_names_the_file(tmp_path, text):
    from lightllm_mtp.config.model_config import ModelConfig, ModelConfigError

    (tmp_path / "config.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(ModelConfigError, match="config.json: "):
        ModelConfig.from_model_dir(tmp_path)
