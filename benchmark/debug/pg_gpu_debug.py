"""Where the prefill graphs fail on the GPU (NOTES, stop 25): builds an engine with them and logs every bucket /
layout before its warm-up and capture. `CUDA_LAUNCH_BLOCKING=1` names the faulting kernel;
`compute-sanitizer --tool memcheck python3 benchmark/debug/pg_gpu_debug.py tiny` the faulting access.

    python3 benchmark/debug/pg_gpu_debug.py tiny|27b
"""

import logging
import sys
import tempfile
import traceback

logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s: %(message)s")
for noisy in ("urllib3", "filelock"):
    logging.getLogger(noisy).setLevel(logging.WARNING)

from benchmark.model_source import build_engine, resolve_source  # noqa: E402
from lightllm_mtp import LLM  # noqa: E402
from lightllm_mtp.tools.make_tiny_checkpoint import build_tiny_checkpoint  # noqa: E402

try:
    if sys.argv[1:] == ["27b"]:
        import argparse

        ns = argparse.Namespace(model_dir=None, model_shape="qwen3.5-27b", seed=0, device="cuda", dtype="auto",
                                batch_sizes=[2], chunked_prefill_size=8192, graph_max_batch_size=None, mtp_layers=1,
                                mtp_mode="eagle_with_att", mtp_step=1,
                                engine_extra=dict(prefix_cache=True, prefix_cache_interval=256,
                                                  prefix_cache_state_share=0.5, max_total_token_num=65536))
        build_engine(resolve_source(ns), ns, 8384, mtp=True)
    else:
        d = build_tiny_checkpoint(arch="qwen3_5", out_dir=tempfile.mkdtemp(), mtp_layers=3, seed=1, ptd=True)
        LLM(d, device="cuda", dtype="float32", max_model_len=512, graph_max_batch_size=8, chunked_prefill_size=256,
            prefix_cache_interval=64, prefix_cache_state_share=0.5, mtp_mode="eagle_with_att", mtp_step=1)
    print("OK built")
except Exception:
    traceback.print_exc()
