"""Main job: generate from a few prompts with the offline API.

With no --model_dir it uses the trained tiny Qwen3.5 checkpoint shipped in lightllm_mtp/fixtures/ (or, where that
is absent, a random-weight tiny checkpoint built on first use into the cache dir).
"""

from __future__ import annotations

import argparse
import time

DEFAULT_PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\n", "class Stack:\n    def push(self, item):"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lightllm_mtp", description=__doc__)
    parser.add_argument("--model_dir", default=None, help="checkpoint directory (default: the shipped tiny one)")
    parser.add_argument("--prompt", action="append", help="prompt text (repeatable); default: three code prompts")
    parser.add_argument("--max_new_tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    args = parser.parse_args(argv)

    from lightllm_mtp import LLM, SamplingParams

    model_dir = args.model_dir
    if model_dir is None and args.device == "cpu":
        import torch

        torch.set_num_threads(1)  # the tiny default model is latency-bound: extra threads only add overhead
    if model_dir is None:
        from lightllm_mtp.tools.default_checkpoint import default_model_dir

        model_dir = default_model_dir()
    llm = LLM(model_dir, device=args.device, dtype=args.dtype)
    prompts = args.prompt or DEFAULT_PROMPTS
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=0)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    for prompt, out in zip(prompts, outputs):
        print(f"=== prompt: {prompt!r}\n{prompt}{out.text}\n--- {len(out.token_ids)} tokens, finish={out.finish_reason}")
    total = sum(len(o.token_ids) for o in outputs)
    print(f"model: {model_dir}\ngenerated {total} tokens in {elapsed:.2f} s ({total / elapsed:.1f} tok/s)")


if __name__ == "__main__":
    main()
