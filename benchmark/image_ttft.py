"""Issue 34's target: the 27B shape with its published vision tower (random weights), one 1024 x 1024 image + 128 text
tokens per request: the tower alone (time against its FLOPs at the measured bf16 matmul peak), the time to first
token (tower + prefill), then MTP k=1 steps at B=1 and B=8 (each request with its own image).

    python benchmark/image_ttft.py [--model_shape qwen3.5-27b] [--batch_sizes 1,8] [--steps 32] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from PIL import Image

from benchmark.model_shapes import MODEL_SHAPES
from benchmark.timing import result_header, write_json
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.multimodal.image_input import expand_image_tokens
from lightllm_mtp.multimodal.image_processor import ImageProcessor
from lightllm_mtp.sampling_params import SamplingParams

# Qwen3.5's published tower (every size shares it; out_hidden_size is the text model's hidden size)
VISION = {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "in_channels": 3,
          "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "num_position_embeddings": 2304,
          "hidden_act": "gelu_pytorch_tanh", "deepstack_visual_indexes": [], "model_type": "qwen3_5_vision"}
TOKENS = {"image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
          "vision_end_token_id": 248054}  # fmt: skip


def image_checkpoint(shape: str, root: Path) -> Path:
    """A config-only image-text checkpoint of the text shape (weights: LoadFormat.DUMMY)."""
    text = dict(MODEL_SHAPES[shape])
    text["model_type"] = text["model_type"] if text["model_type"].endswith("_text") else text["model_type"] + "_text"
    text["rope_parameters"] = {**text["rope_parameters"], "mrope_section": [11, 11, 10], "mrope_interleaved": True}
    arch = "Qwen3_5MoeForConditionalGeneration" if "moe" in text["model_type"] else "Qwen3_5ForConditionalGeneration"
    cfg = {"architectures": [arch], "model_type": text["model_type"].removesuffix("_text"), "text_config": text,
           "vision_config": {**VISION, "out_hidden_size": text["hidden_size"]}, **TOKENS,
           "tie_word_embeddings": text.get("tie_word_embeddings", False)}  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg))
    return root


def tower_flops(n_patches: int, n_tokens: int, v: dict, out_hidden: int) -> float:
    h, inter = v["hidden_size"], v["intermediate_size"]
    patch = 3 * 2 * 16 * 16
    per_block = 2 * n_patches * (4 * h * h + 2 * h * inter) + 4 * n_patches * n_patches * h  # projections + attention
    merger = 2 * n_tokens * (4 * h * 4 * h + 4 * h * out_hidden)
    return 2 * n_patches * patch * h + v["depth"] * per_block + merger


def matmul_peak_tflops(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * 20 / (time.perf_counter() - t0) / 1e12


def picture(seed: int, size: int = 1024) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8))


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model_shape", default="qwen3.5-27b", choices=sorted(MODEL_SHAPES))
    p.add_argument("--batch_sizes", default="1,8")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--text_tokens", type=int, default=128)
    p.add_argument("--image_size", type=int, default=1024)
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (small shapes)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    model_dir = image_checkpoint(args.model_shape, Path(tempfile.mkdtemp()) / "ckpt")
    batches = [int(b) for b in args.batch_sizes.split(",")]
    engine_args = EngineArgs(model_dir=str(model_dir), load_format="dummy", device=args.device, dtype="auto",
                             mtp_mode="eagle_with_att", mtp_step=1, max_batch_size=max(batches), max_model_len=4096,
                             prefix_cache=False, chunked_prefill_size=8192)  # fmt: skip
    engine = LLMEngine(engine_args)
    vision = engine.model_config.vision
    processor = ImageProcessor.load(model_dir, vision)
    rng = np.random.default_rng(0)

    def request(seed: int):
        image = processor.preprocess(picture(seed, args.image_size))
        text = rng.integers(1000, 200000, args.text_tokens).tolist()
        ids = [vision.vision_start_token_id, vision.image_token_id, vision.vision_end_token_id] + text
        return expand_image_tokens(ids, [image], vision.image_token_id), [image]

    params = SamplingParams(temperature=0.0, max_new_tokens=args.steps + 8, ignore_eos=True)
    tower = engine.model_runner.image_rows.tower
    warm = request(999)
    for _ in range(2):
        tower(warm[1])
    sync()
    tower_ms = []
    for i in range(5):
        image = request(100 + i)[1]
        sync()
        t0 = time.perf_counter()
        tower(image)
        sync()
        tower_ms.append((time.perf_counter() - t0) * 1e3)
    image = warm[1][0]
    flops = tower_flops(image.pixel_values.shape[0], image.num_tokens, VISION, engine.model_config.hidden_size)
    peak = matmul_peak_tflops() if dev.type == "cuda" else float("nan")
    report = {"tower": {"patches": image.pixel_values.shape[0], "tokens": image.num_tokens, "gflops": flops / 1e9,
                        "ms_median": statistics.median(tower_ms), "matmul_peak_tflops": peak,
                        "floor_ms": flops / peak / 1e9,
                        "share_of_peak": flops / peak / 1e9 / statistics.median(tower_ms)}}  # fmt: skip
    engine.add_request(*warm[:1], params, images=warm[1])  # warm-up: kernels compiled, graphs replayed
    while engine.has_unfinished():
        engine.step()
    ttft = []
    for i in range(3):
        ids, images = request(200 + i)
        sync()
        t0 = time.perf_counter()
        req = engine.add_request(ids, SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True), images=images)
        while not req.output_ids:
            engine.step()
        sync()
        ttft.append((time.perf_counter() - t0) * 1e3)
        while engine.has_unfinished():
            engine.step()
    report["ttft_ms"] = {"prompt_tokens": len(ids), "median": statistics.median(ttft), "runs": ttft}
    report["decode"] = {}
    for b in batches:
        reqs = []
        for i in range(b):
            ids, images = request(300 + 10 * b + i)
            reqs.append(engine.add_request(ids, params, images=images))
        while any(not r.output_ids for r in reqs):
            engine.step()
        times = []
        for _ in range(args.steps):
            sync()
            t0 = time.perf_counter()
            engine.step()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        tokens = sum(len(r.output_ids) for r in reqs)
        while engine.has_unfinished():
            engine.step()
        report["decode"][b] = {"step_ms_median": statistics.median(times), "mtp_k": 1,
                               "accepted_per_verify": sum(r.spec_stats.accepted_drafts for r in reqs)
                               / max(1, sum(r.spec_stats.verify_steps for r in reqs)), "tokens": tokens}  # fmt: skip
    print(json.dumps(report, indent=1))
    write_json(dict(result_header("benchmark/image_ttft.py", argv, args, dev), **report), args.out)


if __name__ == "__main__":
    main()
