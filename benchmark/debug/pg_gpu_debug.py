import traceback, torch
from lightllm_mtp import LLM
from lightllm_mtp.tools.make_tiny_checkpoint import build_tiny_checkpoint
import tempfile
d = build_tiny_checkpoint(arch="qwen3_5", out_dir=tempfile.mkdtemp(), mtp_layers=3, seed=1, ptd=True)
try:
    LLM(d, device="cuda", dtype="float32", max_model_len=512, graph_max_batch_size=8, chunked_prefill_size=256,
        prefix_cache_interval=64, prefix_cache_state_share=0.5)
    print("OK built")
except Exception:
    traceback.print_exc()
