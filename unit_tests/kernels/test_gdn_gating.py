"""gdn_gating against float64 formulas: g = -exp(A_log) * log(1 + exp(a + dt_bias)), beta = sigmoid(b)."""

import pytest
import torch

from lightllm_mtp.kernels.gdn_gating import gdn_gating


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
