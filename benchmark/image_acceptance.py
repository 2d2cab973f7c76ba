"""MTP acceptance with an image in the prompt (issue 34), on the tiny image-text fixture (the trained text model with
a seeded random tower, lightllm_mtp/tools/make_tiny_vision.py): the same held-out prompts alone and after an image,
greedy, eagle k=1 (or --mtp_step), the share of drafts accepted in each set.

    python -m benchmark.image_acceptance [--prompts 8] [--new 48] [--mtp_step 1] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image
from transformers import AutoTokenizer

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.multimodal.image_input import expand_image_tokens
from lightllm_mtp.multimodal.image_processor import ImageProcessor
from lightllm_mtp.sampling_params import SamplingParams
from lightllm_mtp.tools.default_checkpoint import FIXTURES_DIR, TRAINED_CHECKPOINTS
from lightllm_mtp.tools.make_tiny_vision import make_tiny_vision
from lightllm_mtp.tools.tiny_corpus import heldout_prompts, split_corpus


def accepted_share(reqs) -> float:
    return sum(r.spec_stats.accepted_drafts for r in reqs) / max(1, sum(r.spec_stats.drafts for r in reqs))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt_tokens", type=int, default=48)
    p.add_argument("--new", type=int, default=48)
    p.add_argument("--mtp_step", type=int, default=1)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    model_dir = make_tiny_vision(Path(tempfile.mkdtemp()) / "ckpt", FIXTURES_DIR / TRAINED_CHECKPOINTS["qwen3_5"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = [ids for _, ids in heldout_prompts(tokenizer, split_corpus().heldout, a.prompts, a.prompt_tokens)]
    engine = LLMEngine(EngineArgs(model_dir=str(model_dir), mtp_mode="eagle_with_att", mtp_step=a.mtp_step,
                                  max_model_len=512, max_batch_size=a.prompts))  # fmt: skip
    vision = engine.model_config.vision
    processor = ImageProcessor.load(model_dir, vision)
    params = SamplingParams(temperature=0.0, max_new_tokens=a.new, ignore_eos=True)

    def run(requests):
        reqs = [engine.add_request(ids, params, images=images) for ids, images in requests]
        while engine.has_unfinished():
            engine.step()
        return reqs

    alone = run([(t, []) for t in texts])
    with_image = []
    for i, t in enumerate(texts):
        rng = np.random.default_rng(100 + i)
        image = processor.preprocess(Image.fromarray(rng.integers(0, 256, (56, 40, 3), dtype=np.uint8)))
        ids = [vision.vision_start_token_id, vision.image_token_id, vision.vision_end_token_id] + t
        with_image.append((expand_image_tokens(ids, [image], vision.image_token_id), [image]))
    after_image = run(with_image)
    command = ["python -m benchmark.image_acceptance", *(argv if argv is not None else sys.argv[1:])]
    report = {"command": " ".join(command),
              "mtp_step": a.mtp_step, "prompts": a.prompts, "new_tokens": a.new,
              "image_tokens": with_image[0][1][0].num_tokens,
              "accepted_share_text_alone": accepted_share(alone),
              "accepted_share_after_an_image": accepted_share(after_image)}  # fmt: skip
    print(json.dumps(report, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
