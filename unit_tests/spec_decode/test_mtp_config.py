import pytest

from lightllm_mtp import LLM
from lightllm_mtp.common.weight_loader import WeightLoadError
from lightllm_mtp.config.spec_config import MtpMode, SpecConfig


@pytest.mark.parametrize("step", [0, 8, -1])
def test_mtp_step_range(step):
    with pytest.raises(ValueError, match="mtp_step must be an int in"):
        SpecConfig(MtpMode.EAGLE_WITH_ATT, step)


def test_unknown_mode_lists_the_choices():
    with pytest.raises(ValueError, match="eagle_with_att, vanilla_with_att"):
        SpecConfig.from_args("medusa", 1, None)


def test_step_without_mode(tiny_dense_dir):
    with pytest.raises(ValueError, match="mtp_step / mtp_draft_model_dir need mtp_mode"):
        LLM(tiny_dense_dir, mtp_step=2)


def test_vanilla_needs_one_mtp_layer_per_step(tiny_dense_dir):
    with pytest.raises(ValueError, match="needs 3 MTP layers"):
        LLM(tiny_dense_dir, mtp_mode="vanilla_with_att", mtp_step=3)


def test_checkpoint_without_mtp_weights_fails_clearly(tiny_dense_dir, tmp_path):
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    dst = tmp_path / "no_mtp"
    shutil.copytree(tiny_dense_dir, dst)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    for shard in sorted(set(index["weight_map"].values())):
        tensors = {k: v for k, v in load_file(str(dst / shard)).items() if not k.startswith("mtp.")}
        save_file(tensors, str(dst / shard))
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith("mtp.")}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    LLM(dst)  # plain decoding still works
    with pytest.raises(WeightLoadError, match="no MTP weights"):
        LLM(dst, mtp_mode="eagle_with_att", mtp_step=1)
