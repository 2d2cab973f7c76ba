"""silu_and_mul against x_gate * sigmoid(x_gate) * x_up computed in float64."""

import pytest
import torch

from lightllm_mtp.kernels.activation.silu_and_mul import silu_and_mul


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("t,inter", [(1, 8), (17, 96), (5, 3)])
def test_matches_formula(dtype, tol, t, inter):
    torch.manual_seed(t * inter)
    x = (torch.randn(t, 2 * inter) * 3).to(dtype)
    x64 = x.double()
    gate, up = x64[:, :inter], x64[:, inter:]
    expected = gate * torch.sigmoid(gate) * up
    out = silu_and_mul(x)
    assert out.shape == (t, inter) and out.dtype == dtype
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)


def test_validation():
    with pytest.raises(ValueError, match=": x must"):
        silu_and_mul(torch.randn(4, 7))


@pytest.mark.gpu
@pytest.mark.parametrize("bsz", [1, 8, 32])
def test_triton_matches_reference_gpu(bsz):
    from lightllm_mtp.kernels.activation.silu_and_mul import silu_and_mul_ref, silu_and_mul_triton

    torch.manual_seed(bsz)
    x = (torch.randn(bsz, 2 * 17408, device="cuda") * 3).to(torch.bfloat16)
    out = silu_and_mul_triton(x)
    assert out.shape == (bsz, 17408)
    torch.testing.assert_close(out, silu_and_mul_ref(x), rtol=1.6e-2, atol=1e-2)
