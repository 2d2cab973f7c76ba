#!/usr/bin/env bash
# The GPU runs behind the current figures (README, benchmark/NOTES.md), one device call each (each well under 10
# minutes on an H100). Decided A/B experiments are not here: benchmark/NOTES.md, "Decided experiments", says what each
# tried, what it measured and the commit that still has its target and patches.
#   bash benchmark/gpu_runs.sh tests    # every GPU test (kernels, engine, spec decode, prefix cache, prefill graphs)
#   bash benchmark/gpu_runs.sh 27b      # 27B: no-spec at B=1,32
#   bash benchmark/gpu_runs.sh 27b_k1   # 27B: no-spec + MTP k=1 (eagle_with_att) at B=1,32
#   bash benchmark/gpu_runs.sh mem_fraction  # 27B, --mem_fraction 0.9, MTP k=1: the KV pool it sizes, filled with 7k-token
#                                       # requests at B=64; peak reserved and used fraction of the GPU
#   bash benchmark/gpu_runs.sh 27b_k3_forced  # 27B MTP k=3 at B=1,32 (a full-batch verify at B=32), real (random
#                                       # weights: ~0 acceptance) and forced at a mean accept length of 2.5
#   bash benchmark/gpu_runs.sh 27b_large_batch  # 27B no-spec decode at B=64,96,128 (as memory allows)
#   bash benchmark/gpu_runs.sh 35b      # 35B-A3B: no-spec at B=1,32, with the plot
#   bash benchmark/gpu_runs.sh 35b_k1   # 35B-A3B: MTP k=1 (eagle_with_att) at B=1,32
#   bash benchmark/gpu_runs.sh peer     # 27B: our engine vs HF transformers generate at B=1,8 (ours freed first)
#   bash benchmark/gpu_runs.sh prefill16k  # 27B 1x16k prefill (static_inference), then a kernel breakdown of one 16k
#                                       # prefill by category (profile_step.py --prefill)
#   bash benchmark/gpu_runs.sh 35b_prefill  # 35B-A3B 1x16k prefill against the matmul peak, and its profile
#   bash benchmark/gpu_runs.sh gemv     # the few-row GEMV vs cuBLAS at the 35B-A3B / 27B projection shapes
#   bash benchmark/gpu_runs.sh moe_kernels  # the MoE kernel GPU tests, then the MoE decode layer per-layer timing
#                                       # at the 35B-A3B shape with a tile sweep (check_moe_decode_gpu.py)
#   bash benchmark/gpu_runs.sh moe_prefill  # the prefill MoE path (fused_moe_grouped) at the 35B-A3B shape, T = 4k and
#                                       # 16k, vs its previous index_add_ version, with its pieces (check_moe_prefill_gpu.py)
#   bash benchmark/gpu_runs.sh profile_35b  # 35B-A3B eager kernel breakdown of a decode step at B=1 and an MTP k=1
#                                       # step at B=32 (profile_step.py; kernel counts per step)
#   bash benchmark/gpu_runs.sh latency_floor  # the least time of a dependent kernel and the one-row GEMV's latency +
#                                       # bandwidth fit (check_dependent_kernels_gpu.py), then the engine's GPU tests
#   bash benchmark/gpu_runs.sh draft_cost [KS]  # 27B draft cost per step by mode, k = 1..7 (or the list KS)
#   bash benchmark/gpu_runs.sh draft_vocab  # 27B eagle k=1,3 with the full vs a 32k-id draft vocabulary
#   bash benchmark/gpu_runs.sh adaptive_grid  # 27B: adaptive k vs the best fixed k on a (B, acceptance) grid
#   bash benchmark/gpu_runs.sh draft_model_cost [KS]  # 27B with a 0.8B-shape draft model: autoregressive vs PARD
#                                       # (and MTP eagle beside them), k = 1..5 (or KS)
#   bash benchmark/gpu_runs.sh train_mtp3_ptd  # the trained tiny fixture with 3 MTP modules and PTD mask inputs,
#                                       # then its acceptance on the GPU; packed as $OUT/<fixture>.tar.part-* (the
#                                       # device tool returns at most 8 files), unpacked into fixtures/
#   bash benchmark/gpu_runs.sh train_drafts  # the trained tiny draft and PARD draft for tiny_qwen3_5_trained, then
#                                       # their acceptance on the GPU; packed like train_mtp3_ptd
#   bash benchmark/gpu_runs.sh prefix_cache  # 27B, MTP k=1: TTFT of an 8k shared prefix + 128-token question, cold vs
#                                       # warm prefix cache and without it; then the prefix-cache GPU-path tests
#   bash benchmark/gpu_runs.sh moe_prefill_graphs  # 35B-A3B TTFT, 8k prefix + 128, eagle k=1: with and without the
#                                       # prefill graphs
#   bash benchmark/gpu_runs.sh prefix_sync_sites  # prefix_cache's TTFTs and the host lines that wait on the device
#   bash benchmark/gpu_runs.sh multi_turn_steps  # the multi-turn trace of prefix_serving_27b on the engine directly,
#                                       # every step timed, cache on vs off, and the host lines that wait on the device
#   bash benchmark/gpu_runs.sh serving_27b|serving_35b|serving_tiny  # the HTTP server under load (MTP off, k=1, k=3;
#                                       # concurrency 1, 8, 32); needs the server extra's wheels in .whl_server/
#   bash benchmark/gpu_runs.sh prefix_serving  # trained tiny checkpoint behind the server, MTP k=1: multi-turn
#                                       # and shared-prefix workloads with vs without the prefix cache (server extra)
#   bash benchmark/gpu_runs.sh prefix_serving_27b  # 27B shape behind the server, MTP k=1: multi-turn with vs without
#                                       # the prefix cache (server extra: carry .whl_server too)
#   bash benchmark/gpu_runs.sh mixed    # 27B, MTP k=1, 32 running with arrivals: this tree, then baseline/ (an older
#                                       # commit exported with `git archive REV --prefix=baseline/`; carry baseline)
#   bash benchmark/gpu_runs.sh tp2_tests  # (nvidia-h200-x2) the tp / pp GPU tests (greedy tokens of 2 GPUs equal one
#                                       # GPU's, plain and MTP)
#   bash benchmark/gpu_runs.sh tp2_27b  # 27B, each plain + MTP k=1 at B=1,32: tp=1 (one GPU of the two), tp=2; then
#                                       # the tp collectives (check_collectives.py)
#   bash benchmark/gpu_runs.sh pp2_27b  # 27B pp=2, plain + MTP k=1 at B=1,32
#   bash benchmark/gpu_runs.sh tp2_35b  # 35B-A3B tp=2, plain + MTP k=1 at B=1,32, and its collectives
#   bash benchmark/gpu_runs.sh pp_one_gpu  # tp / pp on ONE GPU (LIGHTLLM_MTP_DIST_BACKEND=gloo, all ranks on cuda:0):
#                                       # greedy equivalence (pp=2 with CUDA graphs per stage, tp=2 eager; prefix cache
#                                       # on every rank), then 0.8B shape pp=2 + MTP k=1 at B=1,8 with graphs per stage
#                                       # vs eager
#   bash benchmark/gpu_runs.sh long_context_27b  # issue 33, 27B B=1: attention kernel, last chunk, decode at 32k..1M
#                                       # (synthetic contexts), whole prefills of 128k and 256k (YaRN past 256k)
#   bash benchmark/gpu_runs.sh long_context_27b_prefill512k  # 27B: the whole 512k prefill (~3-4 min predicted)
#   bash benchmark/gpu_runs.sh long_context_27b_k1|long_context_27b_k3  # 27B eagle k=1 / k=3 steps at 256k and 1M,
#                                       # forced acceptance 0.8 per position (step cost: over long_context_27b's decode)
#   bash benchmark/gpu_runs.sh long_context_27b_adaptive  # 27B adaptive k (mtp_step 3): the start-up table with its
#                                       # per-context-token term, the choice at 128k..1M for acceptance 0.8 / 0.6
#   bash benchmark/gpu_runs.sh long_context_35b|long_context_35b_mtp  # 35B-A3B at 256k: plain (whole prefill), then
#                                       # eagle k=1 and k=3 (forced acceptance 0.8 per position)
# Results go to $OUT (the device tool's folder) or benchmark/results; each JSON holds its exact command.
# fla-core travels as a wheel in .whl/, the server extra's wheels in .whl_server/ (benchmark/README.md, "GPU runs").
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=$(ls .whl/*.whl .whl_server/*.whl 2>/dev/null || true)  # .whl: fla-core; .whl_server: the server extra
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 LIGHTLLM_MTP_DISABLE_PROGRESS_BARS=1
out=${OUT:-benchmark/results}
bench() { python3 benchmark/static_inference.py --device cuda --input_len 1024 "$@"; }
case "${1:-}" in
  tests) python3 -m pytest -q -m gpu unit_tests test ;;
  27b) bench --model_shape qwen3.5-27b --batch_sizes 1,32 --output_len 48 --out "$out/static_qwen3.5-27b_h100.json" ;;
  27b_k1) bench --model_shape qwen3.5-27b --batch_sizes 1,32 --output_len 48 --mtp_mode eagle_with_att --mtp_step 1 \
      --out "$out/static_qwen3.5-27b_mtp_k1_h100.json" ;;
  mem_fraction) python3 benchmark/check_mem_fraction_gpu.py --model_shape qwen3.5-27b --mem_fraction 0.9 \
      --max_batch_size 64 --prompt_len 7000 --output_len 32 --out "$out/mem_fraction_qwen3.5-27b_h200.json" ;;
  27b_k3_forced)
    bench --model_shape qwen3.5-27b --batch_sizes 1,32 --output_len 48 --mtp_mode eagle_with_att --mtp_step 3 \
      --out "$out/static_qwen3.5-27b_mtp_k3_h200.json"
    bench --model_shape qwen3.5-27b --batch_sizes 1,32 --output_len 48 --mtp_mode eagle_with_att --mtp_step 3 \
      --mtp_force_acceptance mean=2.5 --out "$out/static_qwen3.5-27b_mtp_k3_forced_h200.json" ;;
  27b_large_batch)  # one engine per batch size (the engine is sized for its largest batch), graphs up to that size
    for bs in 64 96 128; do
      bench --model_shape qwen3.5-27b --batch_sizes "$bs" --output_len 32 --graph_max_batch_size "$bs" \
        --out "$out/static_qwen3.5-27b_bs${bs}_h100.json" || echo "27B at B=$bs did not run (see above)"
    done ;;
  35b) bench --model_shape qwen3.5-35b-a3b --batch_sizes 1,32 --output_len 48 --plot \
      --out "$out/static_qwen3.5-35b-a3b_h100.json" ;;
  35b_k1) bench --model_shape qwen3.5-35b-a3b --batch_sizes 1,32 --output_len 48 --mtp_mode eagle_with_att \
      --mtp_step 1 --out "$out/static_qwen3.5-35b-a3b_mtp_k1_h100.json" ;;
  peer) bench --model_shape qwen3.5-27b --batch_sizes 1,8 --output_len 32 --hf_peer --hf_batch_sizes 1,8 \
      --out "$out/static_qwen3.5-27b_hf_peer_h100.json" ;;
  prefill16k)
    python3 benchmark/static_inference.py --model_shape qwen3.5-27b --device cuda --batch_sizes 1 --input_len 16384 \
      --output_len 4 --out "$out/static_qwen3.5-27b_prefill16k_fused_h100.json"
    python3 benchmark/profile_step.py --model_shape qwen3.5-27b --prefill --input_len 16384 \
      --out "$out/profile_prefill16k_qwen3.5-27b_h100.json" ;;
  35b_prefill)  # 35B-A3B 1x16k prefill: GEMM FLOPs / wall against the measured bf16 matmul peak, and its profile
    python3 benchmark/static_inference.py --model_shape qwen3.5-35b-a3b --device cuda --batch_sizes 1 --input_len 16384 \
      --output_len 4 --out "$out/static_qwen3.5-35b-a3b_prefill16k_h100.json"
    python3 benchmark/profile_step.py --model_shape qwen3.5-35b-a3b --prefill --input_len 16384 \
      --out "$out/profile_prefill16k_qwen3.5-35b-a3b_h100.json" ;;
  gemv) python3 benchmark/check_gemv_gpu.py --out "$out/gemv_vs_cublas_h100.json" ;;
  moe_kernels) python3 -m pytest -q -m gpu unit_tests/kernels/moe
    python3 benchmark/check_moe_decode_gpu.py ;;
  moe_prefill) python3 -m pytest -q -m gpu unit_tests/kernels/moe/test_moe_permute.py unit_tests/kernels/moe/test_fused_moe.py
    python3 benchmark/check_moe_prefill_gpu.py --out "$out/moe_prefill_35b_a3b_h100.json" ;;
  profile_35b)
    python3 benchmark/profile_step.py --model_shape qwen3.5-35b-a3b --batch_size 1 --steps 6 --top 25 \
      --out "$out/profile_35b_a3b_bs1_moe_kernels.json"
    python3 benchmark/profile_step.py --model_shape qwen3.5-35b-a3b --batch_size 32 --steps 4 --top 25 \
      --mtp_mode eagle_with_att --mtp_step 1 --out "$out/profile_35b_a3b_bs32_mtp_k1_moe_kernels.json" ;;
  latency_floor)
    python3 benchmark/check_dependent_kernels_gpu.py --out "$out/dependent_kernels_h100.json"
    python3 -m pytest -q -m gpu test/test_gpu_engine.py unit_tests/kernels/gdn | tail -3 ;;
  draft_cost) python3 benchmark/draft_cost.py --model_shape qwen3.5-27b --device cuda --ks "${2:-1,2,3,4,5,6,7}" \
      --modes eagle_with_att,ptd,vanilla_with_att --out "$out/draft_cost_qwen3.5-27b_h100.json" \
      --acceptance fixtures/tiny_qwen3_5_mtp3_ptd_trained/acceptance_*.json ;;
  draft_vocab) python3 benchmark/draft_cost.py --model_shape qwen3.5-27b --device cuda --ks 1,3 \
      --modes eagle_with_att --draft_vocab_sizes 0,32768 --out "$out/draft_cost_qwen3.5-27b_draft_vocab_h100.json" ;;
  adaptive_grid) python3 benchmark/adaptive_grid.py --model_shape qwen3.5-27b --device cuda --max_k 3 \
      --batch_sizes 1,2,4,8,16 --out "$out/adaptive_grid_qwen3.5-27b_h100.json" ;;
  draft_model_cost) python3 benchmark/draft_cost.py --model_shape qwen3.5-27b --draft_shape qwen3.5-0.8b \
      --device cuda --ks "${2:-1,2,3,4,5}" --modes draft_model,pard,eagle_with_att \
      --out "$out/draft_model_cost_qwen3.5-27b_0.8b_h100.json" \
      --acceptance ${DRAFTS_DIR:-fixtures}/tiny_qwen3_5_draft*_trained/acceptance_gpu.json \
        lightllm_mtp/fixtures/tiny_qwen3_5_trained/acceptance_gpu_eagle_k1-5.json ;;
  train_mtp3_ptd)  # 3 MTP modules + parallel-drafting mask inputs on one target, then acceptance on the GPU
    name=tiny_qwen3_5_mtp3_ptd_trained
    if [ -n "${OUT:-}" ]; then dir=/tmp/fixtures/$name; else dir=fixtures/$name; fi
    python3 -m training.train_tiny --arch qwen3_5 --mtp_layers 3 --ptd --out "$dir" --no_progress_bar \
      | grep -v '^{"step"'
    if [ -n "${OUT:-}" ]; then tar cf - -C /tmp/fixtures "$name" | split -b 15M - "$OUT/$name.tar.part-"; fi
    python3 -m lightllm_mtp.tools.eval_acceptance --model_dir "$dir" --device cuda --num_prompts 8 \
      --mtp_modes vanilla_with_att eagle_with_att ptd --mtp_steps 1 2 3 4 5 6 7 --strict \
      --out "${OUT:-$dir}/acceptance_gpu.json" ;;
  train_drafts)  # a draft and a PARD draft for the shipped trained target (same tokenizer), then acceptance
    target=lightllm_mtp/fixtures/tiny_qwen3_5_trained
    for name in tiny_qwen3_5_draft_trained tiny_qwen3_5_draft_pard_trained; do
      if [ -n "${OUT:-}" ]; then dir=/tmp/fixtures/$name; else dir=fixtures/$name; fi
      flags=(); mode=draft_model
      if [ "$name" = tiny_qwen3_5_draft_pard_trained ]; then flags=(--pard); mode=pard; fi
      python3 -m training.train_draft --target_dir "$target" --out "$dir" --steps 1500 --batch_size 32 \
        --seq_len 512 "${flags[@]}" | grep -v '^{"step"'
      python3 -m lightllm_mtp.tools.eval_acceptance --model_dir "$target" --draft_model_dir "$dir" --device cuda \
        --num_prompts 8 --mtp_modes "$mode" --mtp_steps 1 2 3 4 5 --strict \
        --out "$dir/acceptance_gpu.json"
      if [ -n "${OUT:-}" ]; then tar cf - -C /tmp/fixtures "$name" | split -b 15M - "$OUT/$name.tar.part-"; fi
    done
    # the target's own MTP head on the same prompts and k, for the comparison table of draft_model_cost
    python3 -m lightllm_mtp.tools.eval_acceptance --model_dir "$target" --device cuda --num_prompts 8 \
      --mtp_modes eagle_with_att --mtp_steps 1 2 3 4 5 --strict \
      --out "$target/acceptance_gpu_eagle_k1-5.json"
    if [ -n "${OUT:-}" ]; then cp "$target/acceptance_gpu_eagle_k1-5.json" "$OUT/"; fi ;;
  prefix_cache)
    python3 benchmark/prefix_cache_ttft.py --model_shape qwen3.5-27b --device cuda --prefix_len 8192 --question_len 128 \
      --mtp_mode eagle_with_att --mtp_step 1 --prefix_cache_interval 256 --max_total_token_num 65536 --breakdown \
      --out "$out/prefix_cache_ttft_qwen3.5-27b_h100.json"
    python3 -m pytest -q -m gpu test/test_gpu_prefix_cache.py test/test_gpu_prefix_cache_draft_model.py \
      unit_tests/spec_decode/test_draft_model_gpu.py unit_tests/kernels/gdn/test_gated_delta_rule_states.py ;;
  moe_prefill_graphs)
    for graphs in "" --no_prefill_graphs; do
      python3 benchmark/prefix_cache_ttft.py --model_shape qwen3.5-35b-a3b --device cuda --prefix_len 8192 \
        --question_len 128 --mtp_mode eagle_with_att --mtp_step 1 --prefix_cache_interval 256 \
        --max_total_token_num 65536 $graphs --out "$out/prefix_cache_ttft_qwen3.5-35b-a3b${graphs:+_eager}_h100.json"
    done ;;
  prefix_sync_sites)  # the warm / cold TTFT of an 8k prefix + 128 and the host lines that wait on the device in them
    python3 benchmark/prefix_cache_ttft.py --model_shape qwen3.5-27b --device cuda --prefix_len 8192 --question_len 128 \
      --mtp_mode eagle_with_att --mtp_step 1 --prefix_cache_interval 256 --max_total_token_num 65536 --repeats 2 \
      --sync_sites --out "$out/prefix_cache_ttft_sync_sites_qwen3.5-27b_h100.json" ;;
  multi_turn_steps)  # the multi-turn trace on the engine (no server), every step timed, cache on vs off, then where
    # the host waits on the device during it (CUDA sync debug mode)
    python3 benchmark/multi_turn_steps.py --model_shape qwen3.5-27b --device cuda --mtp_mode eagle_with_att --mtp_step 1 \
      --sync_sites --out "$out/multi_turn_steps_qwen3.5-27b_h100.json" ;;
  serving_27b|serving_35b|serving_tiny)
    serve=(python3 benchmark/serving.py --launch --device cuda --mtp_configs none,eagle_with_att:1,eagle_with_att:3
           --concurrency 1,8,32 --num_prompts 32 --input_len 512 --output_len 64
           --server_args "--max_req_total_len 1024 --running_max_req_size 32")
    case "$1" in
      serving_27b) "${serve[@]}" --model_shape qwen3.5-27b --out "$out/serving_qwen3.5-27b_h100.json" ;;
      serving_35b) "${serve[@]}" --model_shape qwen3.5-35b-a3b --out "$out/serving_qwen3.5-35b-a3b_h100.json" ;;
      serving_tiny) "${serve[@]}" --model_dir lightllm_mtp/fixtures/tiny_qwen3_5_trained \
        --out "$out/serving_tiny_qwen3_5_trained_h100.json" ;;
    esac ;;
  prefix_serving)
    for workload in multi_turn shared_prefix; do
      python3 benchmark/serving.py --launch --device cuda --model_dir lightllm_mtp/fixtures/tiny_qwen3_5_trained \
        --mtp_configs eagle_with_att:1,eagle_with_att:1/nocache --workload "$workload" --turns 4 --input_len 1024 \
        --shared_prefix_len 2048 --num_groups 4 --question_len 128 --output_len 64 --num_prompts 32 --concurrency 8,32 \
        --server_args "--max_req_total_len 4096 --running_max_req_size 32 --prefix_cache_interval 256 --prefix_cache_state_share 0.5" \
        --out "$out/serving_prefix_${workload}_tiny_qwen3_5_trained_h100.json"
    done ;;
  prefix_serving_27b)  # the issue's multi-turn trace at the 27B shape, MTP k=1, with vs without the prefix cache
    python3 benchmark/serving.py --launch --device cuda --model_shape qwen3.5-27b \
      --mtp_configs eagle_with_att:1,eagle_with_att:1/nocache --workload multi_turn --turns 4 --input_len 1024 \
      --question_len 128 --output_len 64 --num_prompts 16 --concurrency 8 --resend ids \
      --server_args "--max_req_total_len 8192 --running_max_req_size 16 --prefix_cache_interval 256" \
      --out "$out/serving_prefix_multi_turn_qwen3.5-27b_h100.json" ;;
  mixed)
    mixed=(python3 benchmark/mixed_workload.py --model_shape qwen3.5-27b --device cuda --concurrency 32 --num_requests 96
           --input_len 1024 --output_len 64 --chunked_prefill_size 2048 --mtp_mode eagle_with_att --mtp_step 1)
    "${mixed[@]}" --label after --out "$out/mixed_qwen3.5-27b_mtp_k1_h100.json"
    if [ -d baseline ]; then
      "${mixed[@]}" --label "before ($(cat baseline/REVISION 2>/dev/null || echo baseline))" --engine_root baseline \
        --out "$out/mixed_qwen3.5-27b_mtp_k1_h100_before.json"
    fi ;;
  tp2_tests) python3 -m pytest -q -m gpu unit_tests/parallel/test_gpu_parallel.py ;;
  tp2_27b)
    for layout in tp1 tp2; do
      bench --model_shape qwen3.5-27b --batch_sizes 1,32 --output_len 32 --tp "${layout#tp}" --mtp_mode eagle_with_att \
        --mtp_step 1 --out "$out/static_qwen3.5-27b_${layout}_mtp_k1_h200.json"
    done
    python3 benchmark/check_collectives.py --model_shape qwen3.5-27b --tp 2 \
      --out "$out/collectives_qwen3.5-27b_tp2_h200.json" ;;
  pp2_27b) bench --model_shape qwen3.5-27b --batch_sizes 1,32 --output_len 32 --pp 2 --mtp_mode eagle_with_att \
      --mtp_step 1 --out "$out/static_qwen3.5-27b_pp2_mtp_k1_h200.json" ;;
  tp2_35b)
    bench --model_shape qwen3.5-35b-a3b --batch_sizes 1,32 --output_len 32 --tp 2 --mtp_mode eagle_with_att \
      --mtp_step 1 --out "$out/static_qwen3.5-35b-a3b_tp2_mtp_k1_h200.json"
    python3 benchmark/check_collectives.py --model_shape qwen3.5-35b-a3b --tp 2 \
      --out "$out/collectives_qwen3.5-35b-a3b_tp2_h200.json" ;;
  pp_one_gpu)
    python3 -m pytest -q -m gpu unit_tests/parallel/test_gpu_one_gpu.py
    python3 -m pytest -q unit_tests/parallel/test_stage_graphs.py
    for g in 64 0; do  # graph_max_batch_size 0: every forward eager (pp before this issue)
      LIGHTLLM_MTP_DIST_BACKEND=gloo bench --model_shape qwen3.5-0.8b --batch_sizes 1,8 --output_len 32 --pp 2 \
        --mtp_mode eagle_with_att --mtp_step 1 --graph_max_batch_size "$g" \
        --out "$out/static_qwen3.5-0.8b_pp2_gloo_one_gpu_graphs$g.json"
    done ;;
  long_context_27b) python3 benchmark/long_context.py --model_shape qwen3.5-27b --device cuda \
      --lengths 32768,131072,262144,524288,1048576 --real_prefill 131072,262144 \
      --out "$out/long_context_qwen3.5-27b_h200.json" ;;
  long_context_27b_prefill512k) python3 benchmark/long_context.py --model_shape qwen3.5-27b --device cuda \
      --lengths 524288 --real_prefill 524288 --skip_attention_kernel \
      --out "$out/long_context_qwen3.5-27b_prefill512k_h200.json" ;;
  long_context_27b_k1|long_context_27b_k3)
    k=${1##*_k}; rates=$(python3 -c "print(','.join(['0.8'] * $k))")
    python3 benchmark/long_context.py --model_shape qwen3.5-27b --device cuda --lengths 262144,1048576 \
      --skip_attention_kernel --mtp_mode eagle_with_att --mtp_step "$k" --mtp_force_acceptance "$rates" \
      --out "$out/long_context_qwen3.5-27b_mtp_k${k}_h200.json" ;;
  long_context_27b_adaptive) python3 benchmark/long_context.py --model_shape qwen3.5-27b --device cuda \
      --lengths 131072,262144,524288,1048576 --skip_attention_kernel --mtp_mode eagle_with_att --mtp_step 3 \
      --mtp_adaptive --mtp_force_acceptance 0.8,0.8,0.8 --accept_rates 0.8,0.6 \
      --out "$out/long_context_qwen3.5-27b_adaptive_h200.json" ;;
  long_context_35b) python3 benchmark/long_context.py --model_shape qwen3.5-35b-a3b --device cuda \
      --lengths 32768,262144 --real_prefill 262144 --out "$out/long_context_qwen3.5-35b-a3b_h200.json" ;;
  long_context_35b_mtp)
    for k in 1 3; do
      rates=$(python3 -c "print(','.join(['0.8'] * $k))")
      python3 benchmark/long_context.py --model_shape qwen3.5-35b-a3b --device cuda --lengths 262144 \
        --skip_attention_kernel --mtp_mode eagle_with_att --mtp_step "$k" --mtp_force_acceptance "$rates" \
        --out "$out/long_context_qwen3.5-35b-a3b_mtp_k${k}_h200.json"
    done ;;
  *) echo "usage: $0 tests|27b|27b_k1|27b_large_batch|35b|35b_k1|peer|prefill16k|35b_prefill|gemv|moe_kernels|moe_prefill|profile_35b|latency_floor|draft_cost|draft_vocab|adaptive_grid|draft_model_cost|train_mtp3_ptd|train_drafts|prefix_cache|moe_prefill_graphs|prefix_sync_sites|multi_turn_steps|serving_27b|serving_35b|serving_tiny|prefix_serving|prefix_serving_27b|mixed|tp2_tests|tp2_27b|pp2_27b|tp2_35b|pp_one_gpu|long_context_27b|long_context_27b_prefill512k|long_context_27b_k1|long_context_27b_k3|long_context_27b_adaptive|long_context_35b|long_context_35b_mtp" >&2; exit 2 ;;
esac
