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


def test_heads_view_of_a_projection():
    """[T, H, D] gate heads sliced out of a [query | gate] projection, o [T, H, D]: same as the contiguous form."""
    torch.manual_seed(3)
    proj = torch.randn(5, 3, 2 * 16) * 4
    o, gate = torch.randn(5, 3, 16), proj[..., 16:]
    out = sigmoid_gate_mul(o, gate)
    assert out.shape == o.shape and out.is_contiguous()
    expected = sigmoid_gate_mul(o.reshape(5, 48), gate.reshape(5, 48)).view(5, 3, 16)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_triton_heads_view_gpu():
    from lightllm_mtp.kernels.attention.output_gate import sigmoid_gate_mul_ref, sigmoid_gate_mul_triton

    torch.manual_seed(0)
    proj = (torch.randn(4096, 24, 2 * 256, device="cuda") * 3).to(torch.bfloat16)
    o, gate = torch.randn(4096, 24, 256, device="cuda").to(torch.bfloat16), proj[..., 256:]
    torch.testing.assert_close(sigmoid_gate_mul_triton(o, gate), sigmoid_gate_mul_ref(o, gate), rtol=1.6e-2, atol=1e-2)
