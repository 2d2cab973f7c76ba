"""EngineArgs takes what users of other engines pass and holds typed values once parsed."""

import pytest
import torch

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.runtime import LoadFormat
from lightllm_mtp.config.spec_config import MtpMode


def test_strings_and_typed_values_parse_alike():
    a = EngineArgs("m", device="cpu", dtype="float32", load_format="dummy", mtp_mode="eagle_with_att", mtp_step=2)
    b = EngineArgs("m", device=torch.device("cpu"), dtype=torch.float32, load_format=LoadFormat.DUMMY,
                   mtp_mode=MtpMode.EAGLE_WITH_ATT, mtp_step=2)  # fmt: skip
    assert a == b
    assert (a.device, a.dtype, a.load_format, a.mtp_mode) == (
        torch.device("cpu"), torch.float32, LoadFormat.DUMMY, MtpMode.EAGLE_WITH_ATT
    )
    assert a.spec.mode is MtpMode.EAGLE_WITH_ATT and a.spec.num_draft_tokens == 2


def test_auto_dtype_and_no_mtp():
    e = EngineArgs("m")
    assert e.dtype is torch.float32 and e.spec is None and e.mtp_mode is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dtype="fp8"), "dtype"),
        (dict(dtype=torch.int8), "dtype"),
        (dict(device="tpu"), "device"),
        (dict(load_format="pickle"), "load_format"),
        (dict(mtp_mode="medusa", mtp_step=1), "mtp_mode"),
        (dict(mtp_step=2), "mtp_step .* need mtp_mode"),
            (dict(mtp_mode="eagle_with_att"), "needs mtp_step"),
        (dict(mtp_mode="eagle_with_att", mtp_step=9), "mtp_step"),
    ],
)
def test_bad_values_are_rejected_with_their_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs("m", **kwargs)


def test_llm_accepts_a_torch_dtype(tiny_dense_dir):
    from lightllm_mtp import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_new_tokens=3)
    by_name = LLM(tiny_dense_dir, dtype="float32", max_model_len=32).generate([[1, 2, 3]], params)
    typed = LLM(tiny_dense_dir, dtype=torch.float32, device=torch.device("cpu"), max_model_len=32)
    assert typed.engine.args.dtype is torch.float32
    assert typed.generate([[1, 2, 3]], params)[0].token_ids == by_name[0].token_ids
