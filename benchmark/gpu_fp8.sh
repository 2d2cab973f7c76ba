#!/usr/bin/env bash
# Issue 31's GPU targets (block-FP8 weights, FP8 KV cache), one device call each (each under 10 minutes on one H200;
# `122b` needs the whole GPU). Predictions are in benchmark/NOTES.md, "Issue 31 predictions", written before any run.
#   bash benchmark/gpu_fp8.sh tests      # the FP8 GPU tests: kernels against their references on CUDA, the FP8
#                                        # checkpoint / KV engine tests on CUDA
#   bash benchmark/gpu_fp8.sh gemm       # FP8 GEMV / GEMM (weight-only, w8a8) / _scaled_mm blockwise vs bf16 per row
#                                        # count at the 27B / 35B projection shapes (check_fp8_gemm_gpu.py)
#   bash benchmark/gpu_fp8.sh fewrows    # the tiled FP8 GEMM at 1-256 rows, weight-only vs w8a8-in-kernel, launch
#                                        # shapes swept, vs bf16 and the FP8 GEMV (check_fp8_few_rows_gpu.py)
#   bash benchmark/gpu_fp8.sh 27b        # 27B bf16 vs 27B-FP8: decode at B=1,32, MTP eagle k=1 (% of own floor)
#   bash benchmark/gpu_fp8.sh 27b_k3     # 27B-FP8: eagle k=3 and PTD k=3 at B=1,32 (plus bf16 eagle k=3 beside)
#   bash benchmark/gpu_fp8.sh 35b        # 35B-A3B bf16 vs -FP8: decode B=1,32, eagle k=1
#   bash benchmark/gpu_fp8.sh profile    # kernels per B=1 step (eager): 27B-FP8 and 35B-A3B-FP8, decode and k=1
#   bash benchmark/gpu_fp8.sh 122b       # 122B-A10B-FP8 on ONE H200: builds at mem_fraction 0.92 with MTP k=1, the
#                                        # KV tokens that fit (bf16 and FP8 KV), serves B=1,8; then decode / k=1
#                                        # steps at B=1,8 against its floor
#   bash benchmark/gpu_fp8.sh prefill16k # 27B 1x16k prefill, bf16 vs -FP8 (w8a8 GEMMs), tokens/s
#   bash benchmark/gpu_fp8.sh kv32k      # 27B-FP8 at 32k context: decode at B=1,8 with bf16 vs FP8 KV
# Results go to $OUT (the device tool's folder) or benchmark/results; each JSON holds its exact command.
# fla-core travels as a wheel in .whl/ (benchmark/README.md, "GPU runs").
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=$(ls .whl/*.whl 2>/dev/null || true)
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 LIGHTLLM_MTP_DISABLE_PROGRESS_BARS=1
out=${OUT:-benchmark/results}
bench() { python3 benchmark/static_inference.py --device cuda --input_len 1024 "$@"; }
case "${1:-}" in
  tests)
    python3 -m pytest -q -m gpu unit_tests/kernels/quant unit_tests/kernels/attention/test_fp8_kv.py \
      unit_tests/models/test_fp8_checkpoint.py unit_tests/engine/test_fp8_kv_cache.py | tail -5 ;;
  gemm) python3 benchmark/check_fp8_gemm_gpu.py --out "$out/fp8_gemm_vs_bf16_h200.json" ;;
  fewrows) python3 benchmark/check_fp8_few_rows_gpu.py --out "$out/fp8_few_rows_split_h200.json" ;;
  27b)
    bench --model_shape qwen3.5-27b --batch_sizes 1,32 --output_len 48 --mtp_mode eagle_with_att --mtp_step 1 \
      --out "$out/static_qwen3.5-27b_mtp_k1_h200.json"
    bench --model_shape qwen3.5-27b-fp8 --batch_sizes 1,32 --output_len 48 --mtp_mode eagle_with_att --mtp_step 1 \
      --out "$out/static_qwen3.5-27b-fp8_mtp_k1_h200.json" ;;
  27b_k3)
    bench --model_shape qwen3.5-27b-fp8 --batch_sizes 1,32 --output_len 48 --mtp_mode eagle_with_att --mtp_step 3 \
      --out "$out/static_qwen3.5-27b-fp8_mtp_k3_h200.json"
    bench --model_shape qwen3.5-27b-fp8 --batch_sizes 1,32 --output_len 48 --mtp_mode eagle_with_att --mtp_step 3 \
      --parallel_drafting --out "$out/static_qwen3.5-27b-fp8_ptd_k3_h200.json"
    bench --model_shape qwen3.5-27b --batch_sizes 1,32 --output_len 48 --mtp_mode eagle_with_att --mtp_step 3 \
      --out "$out/static_qwen3.5-27b_mtp_k3_h200.json" ;;
  35b)
    bench --model_shape qwen3.5-35b-a3b --batch_sizes 1,32 --output_len 48 --mtp_mode eagle_with_att --mtp_step 1 \
      --out "$out/static_qwen3.5-35b-a3b_mtp_k1_h200.json"
    bench --model_shape qwen3.5-35b-a3b-fp8 --batch_sizes 1,32 --output_len 48 --mtp_mode eagle_with_att \
      --mtp_step 1 --out "$out/static_qwen3.5-35b-a3b-fp8_mtp_k1_h200.json" ;;
  profile)
    for shape in qwen3.5-27b-fp8 qwen3.5-35b-a3b-fp8; do
      python3 benchmark/profile_step.py --model_shape "$shape" --batch_size 1 --steps 6 --top 25 \
        --out "$out/profile_${shape}_bs1_h200.json"
      python3 benchmark/profile_step.py --model_shape "$shape" --batch_size 1 --steps 4 --top 25 \
        --mtp_mode eagle_with_att --mtp_step 1 --out "$out/profile_${shape}_bs1_mtp_k1_h200.json"
    done ;;
  122b)
    for kv in auto fp8; do
      python3 benchmark/kv_capacity.py --model_shape qwen3.5-122b-a10b-fp8 --mem_fraction 0.92 --mtp_step 1 \
        --kv_cache_dtype "$kv" --batch_sizes 1,8 --out "$out/kv_capacity_qwen3.5-122b-a10b-fp8_mtp_k1_kv_${kv}_h200.json"
    done
    bench --model_shape qwen3.5-122b-a10b-fp8 --batch_sizes 1,8 --output_len 32 --mtp_mode eagle_with_att \
      --mtp_step 1 --out "$out/static_qwen3.5-122b-a10b-fp8_mtp_k1_h200.json" ;;
  prefill16k)
    for shape in qwen3.5-27b qwen3.5-27b-fp8; do
      python3 benchmark/static_inference.py --model_shape "$shape" --device cuda --batch_sizes 1 --input_len 16384 \
        --output_len 4 --out "$out/static_${shape}_prefill16k_h200.json"
    done ;;
  kv32k)  # B=8: 64k-token forwards admit all 8 prompts in 4 prefill forwards, so 32 output tokens give a full batch
    for kv in auto fp8; do
      python3 benchmark/static_inference.py --model_shape qwen3.5-27b-fp8 --device cuda --batch_sizes 1 \
        --input_len 32768 --output_len 16 --kv_cache_dtype "$kv" --out "$out/static_qwen3.5-27b-fp8_32k_kv_${kv}_h200.json"
      python3 benchmark/static_inference.py --model_shape qwen3.5-27b-fp8 --device cuda --batch_sizes 8 \
        --input_len 32768 --output_len 32 --chunked_prefill_size 65536 --kv_cache_dtype "$kv" \
        --out "$out/static_qwen3.5-27b-fp8_32k_b8_kv_${kv}_h200.json"
    done ;;
  *) sed -n '2,15p' "$0"; exit 2 ;;
esac
