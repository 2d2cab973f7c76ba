"""rmsnorm / add_rmsnorm against HF Qwen3_5RMSNorm."""

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

from lightllm_mtp.kernels.norm.rmsnorm import add_rmsnorm, rmsnorm


def _hf_norm(weight, eps):
    norm = Qwen3_5RMSNorm(weight.shape[0], eps=eps).to(weight.dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 64), (3, 5, 32), (1, 256)])
def test_rmsnorm_matches_hf(dtype, shape):
    torch.manual_seed(11 + len(shape))
    x = (torch.randn(shape) * 3).to(dtype)
    w = (torch.randn(shape[-1]) * 0.2).to(dtype)
    with torch.no_grad():
        expected = _hf_norm(w, 1e-6)(x)
    out = rmsnorm(x, w, 1e-6)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rmsnorm(dtype):
    torch.manual_seed(5)
    x = torch.randn(9, 48).to(dtype)
    res = torch.randn(9, 48).to(dtype)
    w = (torch.randn(48) * 0.1).to(dtype)
    normed, new_res = add_rmsnorm(x, res, w, 1e-5)
    torch.testing.assert_close(new_res, x + res, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(normed, _hf_norm(w, 1e-5)(x + res), rtol=0, atol=0)


def test_validation():
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match=": weight must"):
        rmsnorm(x, torch.randn(8), 1e-6)
    with pytest.raises(ValueError, match=": residual must"):
        add_rmsnorm(x, torch.randn(4, 8), torch.randn(16), 1e-6)
    with pytest.raises(ValueError, match=": x must"):
        rmsnorm(torch.arange(16).view(2, 8), torch.randn(8), 1e-6)


BF16_TOL = dict(rtol=1.6e-2, atol=1e-2)  # about two bf16 ulps: the Triton and torch reductions round differently


@pytest.mark.gpu
@pytest.mark.parametrize("bsz", [1, 8, 32])
def test_triton_matches_reference_gpu(bsz):
    from lightllm_mtp.kernels.norm.rmsnorm import add_rmsnorm_ref, add_rmsnorm_triton, rmsnorm_ref, rmsnorm_triton

    torch.manual_seed(bsz)
    dev, dt = "cuda", torch.bfloat16
    x = (torch.randn(bsz, 5120, device=dev) * 3).to(dt)
    res = torch.randn(bsz, 5120, device=dev).to(dt)
    w = (torch.randn(5120, device=dev) * 0.2).to(dt)
    torch.testing.assert_close(rmsnorm_triton(x, w, 1e-6), rmsnorm_ref(x, w, 1e-6), **BF16_TOL)
    normed, new_res = add_rmsnorm_triton(x, res, w, 1e-6)
    normed_ref, new_res_ref = add_rmsnorm_ref(x, res, w, 1e-6)
    assert torch.equal(new_res, new_res_ref)
    torch.testing.assert_close(normed, normed_ref, **BF16_TOL)
    # q/k norm over the heads of a fused projection: [T, 24, 256] query rows of [query | gate], [T, 4, 256] keys
    proj = torch.randn(bsz, 24 * 512 + 2 * 4 * 256, device=dev).to(dt)
    q = proj[:, : 24 * 512].view(bsz, 24, 512)[..., :256]
    k = proj[:, 24 * 512 : 24 * 512 + 1024].view(bsz, 4, 256)
    wd = (torch.randn(256, device=dev) * 0.2).to(dt)
    for t in (q, k):
        torch.testing.assert_close(rmsnorm_triton(t, wd, 1e-6), rmsnorm_ref(t, wd, 1e-6), **BF16_TOL)
