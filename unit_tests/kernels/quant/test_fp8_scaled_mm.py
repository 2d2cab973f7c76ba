"""The prefill's w8a8 GEMM through torch._scaled_mm (kernels/quant/fp8_scaled_mm.py): which calls it takes, and on
an sm90 GPU its result against the w8a8 reference (the same activation rounding) at the 27B projection shapes."""

import pytest
import torch

from lightllm_mtp.kernels.quant import fp8_linear as dispatch
from lightllm_mtp.kernels.quant.fp8_block import quantize_fp8_block
from lightllm_mtp.kernels.quant.fp8_scaled_mm import fp8_scaled_mm, fp8_scaled_mm_ref, scaled_mm_fits


def test_takes_no_cpu_call_and_the_dispatch_falls_back(monkeypatch):
    w = quantize_fp8_block(torch.randn(dispatch.SCALED_MM_MIN_OUT, 256) * 0.05, (128, 128))
    x = torch.randn(300, 256, dtype=torch.bfloat16)
    assert not scaled_mm_fits(x, w)
    with pytest.raises(ValueError, match="sm90"):
        fp8_scaled_mm(x, weight=w)
    calls = []
    monkeypatch.setattr(dispatch, "use_triton", lambda t: True)
    monkeypatch.setattr(dispatch, "scaled_mm_fits", lambda x, w: x.shape[1] % 128 == 0)
    monkeypatch.setattr(dispatch, "fp8_scaled_mm", lambda x, weight: calls.append("scaled_mm"))
    monkeypatch.setattr(dispatch, "fp8_gemm_triton", lambda x, weight, act_fp8, **_: calls.append(("triton", act_fp8)))
    for rows in (2, dispatch.SCALED_MM_MIN_ROWS - 1, dispatch.SCALED_MM_MIN_ROWS):
        dispatch.fp8_linear(torch.randn(rows, 256), w)
    assert calls == [("triton", True), ("triton", True), "scaled_mm"]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [257, 4096])
@pytest.mark.parametrize("n,k", [(16384, 5120), (5120, 17408), (5120, 6144)])
def test_scaled_mm_equals_the_w8a8_reference_on_hopper(m, n, k):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm90 GPU")
    torch.manual_seed(m + n)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = quantize_fp8_block(torch.randn(n, k, device="cuda") * 0.02, (128, 128))
    assert scaled_mm_fits(x, w)
    got, want = fp8_scaled_mm(x, weight=w).float(), fp8_scaled_mm_ref(x, w).float()
    assert ((got - want).norm() / want.norm()).item() < 2e-3  # measured 7e-4 (bf16 output rounding)
