"""benchmark/profile_step.py's kernel categories (the profiling itself needs a GPU: gpu_runs.sh prefill16k)."""

from benchmark.profile_step import categories


def test_categories_sum_every_kernel_once():
    rows = [
        {"kernel": "nvjet_tst_256x128_64x4_2x1_v_bz_coopB_TNT", "us_per_step": 1000.0},
        {"kernel": "sm90_xmma_gemm_bf16bf16_bf16f32", "us_per_step": 500.0},
        {"kernel": "_flash_prefill_kernel", "us_per_step": 300.0},
        {"kernel": "chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "us_per_step": 40.0},
        {"kernel": "_conv1d_prefill_kernel", "us_per_step": 20.0},
        {"kernel": "_rmsnorm_kernel", "us_per_step": 30.0},
        {"kernel": "_qk_norm_rope_kernel", "us_per_step": 5.0},
        {"kernel": "void at::native::elementwise_kernel<128, 2>", "us_per_step": 7.0},
    ]
    cats = categories(rows)
    assert cats["GEMM"] == 1.5 and cats["attention"] == 0.3 and cats["GDN chunk (fla)"] == 0.04
    assert cats["GDN conv / gates"] == 0.02 and cats["norms"] == 0.03 and cats["other"] == 0.007
    assert abs(sum(cats.values()) - sum(r["us_per_step"] for r in rows) / 1e3) < 1e-12
