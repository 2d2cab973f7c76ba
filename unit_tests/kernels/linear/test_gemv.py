"""The few-row GEMV (kernels/linear/gemv.py) against its fp32 reference: under Triton's interpreter on CPU, and in
bf16 on the GPU at the router's shape and at wider ones (which `linear` leaves to cuBLAS)."""

import textwrap

import pytest
import torch

from lightllm_mtp.kernels.linear import gemv as gemv_module
from lightllm_mtp.kernels.linear.gemv import GEMV_MAX_ROWS, gemv_ref, gemv_tiles, gemv_triton, linear
from unit_tests.triton_interpreter import run_interpreted

INTERPRET_SCRIPT = textwrap.dedent(
    """
    import torch
    from lightllm_mtp.kernels.linear.gemv import gemv_ref, gemv_triton
    gen = torch.Generator().manual_seed(0)
    # (T, N, K): one row; N and K not multiples of the tiles; a K of several steps; N below the SM count (small
    # BLOCK_N); every T up to the bound
    for t, n, k in ((1, 40, 64), (3, 37, 100), (2, 300, 1000), (4, 17, 24), (1, 2, 4096), (4, 264, 256),
                    (1, 1031, 4100), (2, 1031, 2100)):  # the last two: wide (2-row programs, K steps of 2048)
        x = torch.randn(t, k + 5, generator=gen)[:, 2 : 2 + k]  # strided rows
        w = torch.randn(n, k, generator=gen)
        torch.testing.assert_close(gemv_triton(x, w), gemv_ref(x, w), rtol=1e-5, atol=1e-4)
    print("OK")
    """
)


def test_gemv_kernel_under_the_interpreter():
    pytest.importorskip("triton")
    assert "OK" in run_interpreted(INTERPRET_SCRIPT)


def test_tiles_fill_the_sms():
    assert gemv_tiles(1, 264, 2048, 132) == (1, 2, 2048)  # the 35B-A3B router: 132 programs
    assert gemv_tiles(1, 1024, 4096, 132) == (1, 4, 2048)  # 256 programs of 4 rows
    assert gemv_tiles(1, 2048, 4096, 132) == (1, 2, 2048)  # one row, wide: 2 rows a program, K steps of 2048
    assert gemv_tiles(1, 2048, 1000, 132) == (1, 2, 1024)
    assert gemv_tiles(2, 2048, 4096, 132) == (2, 2, 2048)
    assert gemv_tiles(3, 2048, 4096, 132) == (4, 8, 256)
    assert gemv_tiles(3, 100000, 64, 132) == (4, 16, 64)


def test_linear_takes_the_gemv_for_few_rows_and_narrow_outputs_only(monkeypatch):
    x, w = torch.randn(2, 8), torch.randn(5, 8)
    torch.testing.assert_close(linear(x, w), torch.nn.functional.linear(x, w), rtol=0, atol=0)  # CPU: F.linear
    calls = []
    monkeypatch.setattr(gemv_module, "use_triton", lambda t: True)  # the CUDA dispatch, on CPU tensors
    record = lambda x, w: calls.append((x.shape[0], w.shape[0])) or gemv_ref(x, w)  # noqa: E731
    monkeypatch.setattr(gemv_module, "gemv_triton", record)
    for t, n in ((1, 264), (4, 1024), (5, 264), (2, 1025), (1, 1025)):
        linear(torch.randn(t, 8), torch.randn(n, 8))
    assert calls == [(1, 264), (4, 1024)]  # more rows, or wider outputs in fp32 or at T >= 2: cuBLAS
    bf16 = dict(dtype=torch.bfloat16)
    linear(torch.randn(1, 4096, **bf16), torch.randn(5000, 4096, **bf16))
    linear(torch.randn(2, 2048, **bf16), torch.randn(5000, 2048, **bf16))
    linear(torch.randn(2, 4096, **bf16), torch.randn(2048, 4096, **bf16))
    linear(torch.randn(2, 4096, **bf16), torch.randn(5000, 4096, **bf16))
    linear(torch.randn(3, 8, **bf16), torch.randn(5000, 8, **bf16))
    # one 16-bit row: every width; two: where K or N <= 2048; three or more: cuBLAS
    assert calls[2:] == [(1, 5000), (2, 5000), (2, 2048)]
    # what F.linear takes and the GEMV does not: a transposed weight, 3-D x, no rows, a 1-D weight
    calls.clear()
    w = torch.randn(8, 5, **bf16)
    for x_, w_ in ((torch.randn(1, 8, **bf16), w.t()), (torch.randn(2, 1, 8, **bf16), w.t().contiguous()),
                   (torch.randn(0, 8, **bf16), w.t().contiguous()), (torch.randn(1, 8, **bf16), torch.randn(8, **bf16))):
        torch.testing.assert_close(linear(x_, w_), torch.nn.functional.linear(x_, w_))
    assert calls == []
    with pytest.raises(ValueError, match="weight must"):
        gemv_triton(torch.randn(2, 8), torch.randn(5, 7))
    with pytest.raises(ValueError, match="rows"):
        gemv_triton(torch.randn(GEMV_MAX_ROWS + 1, 8), torch.randn(5, 8))


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 2, 3, 4])
@pytest.mark.parametrize("n,k", [(264, 2048), (2048, 4096), (12352, 2048), (5120, 6144)])
def test_gemv_gpu_bf16(t, n, k):
    torch.manual_seed(t + n)
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    out = gemv_triton(x, w)
    torch.testing.assert_close(out.float(), gemv_ref(x, w).float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(out.float(), torch.nn.functional.linear(x, w).float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out[:1], gemv_triton(x[:1], w), rtol=1e-2, atol=1e-2)  # alone: another K step
