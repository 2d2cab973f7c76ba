"""gdn_gating against float64 formulas: g = -exp(A_log) * log(1 + exp(a + dt_bias)), beta = sigmoid(b)."""

import pytest
import torch

from lightllm_mtp.kernels.gdn.gdn_gating import gdn_gating


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,nv", [(1, 4), (19, 32)])
def test_matches_formula(dtype, t, nv):
    torch.manual_seed(t * nv)
    a = (torch.randn(t, nv) * 8).to(dtype)  # covers the softplus linear regime (> 20)
    a[0, 0] = 25.0
    b = (torch.randn(t, nv) * 3).to(dtype)
    A_log = torch.log(torch.empty(nv).uniform_(0.01, 16))  # kept fp32 like the engine
    dt_bias = torch.randn(nv).to(dtype)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    assert g.dtype == beta.dtype == torch.float32 and g.shape == beta.shape == (t, nv)
    x = a.double() + dt_bias.double()
    expected_g = -A_log.double().exp() * torch.log1p(torch.exp(x))
    torch.testing.assert_close(g.double(), expected_g, rtol=1e-5, atol=1e-6)
    assert bool((g < 0).all())
    expected_beta = 1 / (1 + torch.exp(-b.double()))
    tol = 1e-6 if dtype == torch.float32 else 8e-3  # HF takes the sigmoid in the input dtype
    torch.testing.assert_close(beta.double(), expected_beta, rtol=tol, atol=tol)
    assert torch.equal(beta, torch.sigmoid(b).float())


def test_validation():
    a = torch.randn(3, 4)
    with pytest.raises(ValueError, match=": b must"):
        gdn_gating(a, torch.randn(3, 5), torch.zeros(4), torch.zeros(4))
    with pytest.raises(ValueError, match=": dt_bias must"):
        gdn_gating(a, torch.randn(3, 4), torch.zeros(4), torch.zeros(2))


@pytest.mark.gpu
@pytest.mark.parametrize("bsz", [1, 8, 32])
def test_triton_matches_reference_gpu(bsz):
    from lightllm_mtp.kernels.gdn.gdn_gating import gdn_gating_ref, gdn_gating_triton

    torch.manual_seed(bsz)
    nv = 48
    proj = (torch.randn(bsz, 2 * nv + 3, device="cuda") * 8).to(torch.bfloat16)
    b, a = proj[:, :nv], proj[:, nv : 2 * nv]  # strided, as sliced from the fused in_proj output
    A_log = torch.log(torch.empty(nv, device="cuda").uniform_(0.01, 16))
    dt_bias = torch.randn(nv, device="cuda")
    g, beta = gdn_gating_triton(a, b, A_log, dt_bias)
    g_ref, beta_ref = gdn_gating_ref(a, b, A_log, dt_bias)
    torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(beta, beta_ref, rtol=8e-3, atol=1e-6)  # one bf16 rounding of the sigmoid
