"""sigmoid_gate_mul against x * 1 / (1 + exp(-gate)) in float64."""

import pytest
import torch

from lightllm_mtp.kernels.attention.output_gate import sigmoid_gate_mul


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("t,n", [(1, 16), (9, 512)])
def test_matches_formula(dtype, tol, t, n):
    torch.manual_seed(t + n)
    x = torch.randn(t, n).to(dtype)
    gate = (torch.randn(t, n) * 4).to(dtype)
    expected = x.double() / (1 + torch.exp(-gate.double()))
    out = sigmoid_gate_mul(x, gate)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)


def test_validation():
    with pytest.raises(ValueError, match=": gate must"):
        sigmoid_gate_mul(torch.randn(3, 8), torch.randn(3, 4))
    with pytest.raises(ValueError, match="gate dtype"):
        sigmoid_gate_mul(torch.randn(3, 8), torch.randn(3, 8).bfloat16())


@pytest.mark.gpu
@pytest.mark.parametrize("bsz", [1, 8, 32])
def test_triton_matches_reference_gpu(bsz):
    from lightllm_mtp.kernels.attention.output_gate import sigmoid_gate_mul_ref, sigmoid_gate_mul_triton

    torch.manual_seed(bsz)
    both = (torch.randn(bsz, 2, 24 * 256, device="cuda") * 3).to(torch.bfloat16)
    x, gate = both[:, 0], both[:, 1]  # strided rows
    torch.testing.assert_close(
        sigmoid_gate_mul_triton(x, gate), sigmoid_gate_mul_ref(x, gate), rtol=1.6e-2, atol=1e-2
    )
