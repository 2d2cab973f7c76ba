"""gated_rmsnorm against HF Qwen3_5RMSNormGated."""

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

from lightllm_mtp.kernels.norm.gated_rmsnorm import gated_rmsnorm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,h,d", [(6, 4, 32), (1, 2, 128), (13, 3, 16)])
def test_matches_hf(dtype, t, h, d):
    torch.manual_seed(100 + t)
    x = (torch.randn(t, h, d) * 2).to(dtype)
    z = torch.randn(t, h, d).to(dtype)
    w = (1 + 0.3 * torch.randn(d)).to(dtype)
    norm = Qwen3_5RMSNormGated(d, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
        expected = norm(x.reshape(-1, d), z.reshape(-1, d)).reshape(t, h, d)
    out = gated_rmsnorm(x, z, w, 1e-6)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_validation():
    x = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match=": z must"):
        gated_rmsnorm(x, torch.randn(2, 3, 4), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match=": weight must"):
        gated_rmsnorm(x, torch.randn(2, 3, 8), torch.ones(4), 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("bsz", [1, 8, 32, 4096])  # decode batches and a prefill chunk
def test_triton_matches_reference_gpu(bsz):
    from lightllm_mtp.kernels.norm.gated_rmsnorm import gated_rmsnorm_ref, gated_rmsnorm_triton

    torch.manual_seed(bsz)
    dev, dt, nv, dv = "cuda", torch.bfloat16, 48, 128
    x = torch.randn(bsz, nv, dv, device=dev).to(dt)
    proj = torch.randn(bsz, 10240 + nv * dv + 2 * nv, device=dev).to(dt)
    z = proj[:, 10240 : 10240 + nv * dv].view(bsz, nv, dv)  # the z slice of the fused in_proj output
    w = (1 + 0.3 * torch.randn(dv, device=dev)).to(dt)
    torch.testing.assert_close(
        gated_rmsnorm_triton(x, z, w, 1e-6), gated_rmsnorm_ref(x, z, w, 1e-6), rtol=1.6e-2, atol=1e-2
    )
