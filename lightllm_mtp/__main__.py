"""Main job: generate from a few prompts with MTP speculative decoding, then with plain decoding, and compare.

With no --model_dir it uses the trained tiny Qwen3.5 checkpoint shipped in lightllm_mtp/fixtures/ (or, where that
is absent, a random-weight tiny checkpoint built on first use into the cache dir). Per prompt it prints the text,
the tokens per verify step and the acceptance at each draft position; the closing lines compare with plain decoding
on the same prompts: whether the outputs are identical (they must be, greedy) and the wall time and tok/s of each.
"""

from __future__ import annotations

import argparse
import time

DEFAULT_PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\n", "class Stack:\n    def push(self, item):"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightllm_mtp", description=__doc__)
    parser.add_argument("--model_dir", default=None, help="checkpoint directory (default: the shipped tiny one)")
    parser.add_argument("--prompt", action="append", help="prompt text (repeatable); default: three code prompts")
    parser.add_argument("--max_new_tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    parser.add_argument("--mtp_mode", default="eagle_with_att", choices=["eagle_with_att", "vanilla_with_att"])
    parser.add_argument("--mtp_step", type=int, default=2, help="draft tokens per verify step")
    parser.add_argument("--no_mtp", action="store_true", help="plain decoding only (no comparison)")
    args = parser.parse_args(argv)

    from lightllm_mtp import LLM, SamplingParams

    model_dir = args.model_dir
    if model_dir is None and args.device == "cpu":
        import torch

        torch.set_num_threads(1)  # the tiny default model is latency-bound: extra threads only add overhead
    if model_dir is None:
        from lightllm_mtp.tools.default_checkpoint import default_model_dir

        model_dir = default_model_dir()
    prompts = args.prompt or DEFAULT_PROMPTS
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=0)

    def run(**mtp):
        llm = LLM(model_dir, device=args.device, dtype=args.dtype, **mtp)
        llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_new_tokens=2))  # warm-up, not timed
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        return outputs, time.perf_counter() - start

    mtp = {} if args.no_mtp else dict(mtp_mode=args.mtp_mode, mtp_step=args.mtp_step)
    outputs, elapsed = run(**mtp)
    label = "plain decoding" if args.no_mtp else f"MTP {args.mtp_mode} k={args.mtp_step}"
    for prompt, out in zip(prompts, outputs):
        print(f"=== prompt: {prompt!r}\n{prompt}{out.text}\n--- {len(out.token_ids)} tokens, finish={out.finish_reason}")
        if not args.no_mtp:
            accept = " ".join(f"{a:.2f}" for a in out.spec.acceptance_per_position)
            print(f"--- {out.spec.tokens_per_step:.2f} tokens per verify step, acceptance per draft position: {accept}")
    total = sum(len(o.token_ids) for o in outputs)
    print(f"model: {model_dir}\n{label}: {total} tokens in {elapsed:.2f} s ({total / elapsed:.1f} tok/s)")
    if args.no_mtp:
        return 0
    plain, plain_elapsed = run()
    plain_total = sum(len(o.token_ids) for o in plain)
    same = [o.token_ids for o in outputs] == [o.token_ids for o in plain]
    what = "identical" if same else "DIFFERENT"
    if args.temperature > 0:
        what += " (sampling: equal in distribution, not token for token)"
    print(f"plain decoding: {plain_total} tokens in {plain_elapsed:.2f} s ({plain_total / plain_elapsed:.1f} tok/s)")
    print(f"outputs {what}; MTP / plain wall time {elapsed / plain_elapsed:.2f}x")
    return 0 if same or args.temperature > 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
