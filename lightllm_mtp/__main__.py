"""Main job: generate from a few prompts with MTP speculative decoding, then with plain decoding, and compare.

With no --model_dir it uses the trained tiny Qwen3.5 checkpoint shipped in lightllm_mtp/fixtures/ (or, where that
is absent, a random-weight tiny checkpoint built on first use into the cache dir). Per prompt it prints the text,
the tokens per verify step and the acceptance at each draft position; the closing lines compare with plain decoding
on the same prompts: whether the outputs are identical (they must be, greedy) and the wall time and tok/s of each.
"""

from __future__ import annotations

import argparse
import time

# the speculative options reset for the plain-decoding run
PLAIN = dict(mtp_mode=None, mtp_step=0, mtp_draft_model_dir=None, parallel_drafting=False, mtp_mask_token_id=None,
             mtp_draft_vocab_file=None, mtp_draft_vocab_size=None, mtp_adaptive=False)
DEFAULT_PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\n", "class Stack:\n    def push(self, item):"]


def main(argv: list[str] | None = None) -> int:
    from lightllm_mtp.config.cli import add_options, values_given
    from lightllm_mtp.config.engine_args import EngineArgs

    parser = argparse.ArgumentParser(prog="python -m lightllm_mtp", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    job = parser.add_argument_group("main job")
    job.add_argument("--prompt", action="append", help="prompt text (repeatable); default: three code prompts")
    job.add_argument("--max_new_tokens", "--max-new-tokens", "--max_tokens", "--max-tokens", dest="max_new_tokens",
                     type=int, default=48, help="tokens to generate per prompt (default: %(default)s)")
    job.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    job.add_argument("--no_mtp", "--no-mtp", action="store_true", help="plain decoding only (no comparison)")
    # every engine option, as the server has them; the main job defaults to the shipped model and MTP eagle k=2
    add_options(parser, EngineArgs, optional=("model_dir",),
                defaults=dict(mtp_mode="eagle_with_att", mtp_step=2))  # fmt: skip
    args = parser.parse_args(argv)
    engine_options = values_given(args, EngineArgs)

    from lightllm_mtp import LLM, SamplingParams

    model_dir = engine_options.pop("model_dir", None)
    if model_dir is None:
        from lightllm_mtp.tools.default_checkpoint import default_model_dir

        model_dir = default_model_dir()
    prompts = args.prompt or DEFAULT_PROMPTS
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=0)

    def run(**mtp):
        llm = LLM(model_dir, **{**engine_options, **mtp})
        llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_new_tokens=2))  # warm-up, not timed
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        return outputs, time.perf_counter() - start

    plain_options = {k: v for k, v in PLAIN.items() if k in engine_options or k in ("mtp_mode", "mtp_step")}
    outputs, elapsed = run(**(plain_options if args.no_mtp else {}))
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
    plain, plain_elapsed = run(**plain_options)
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
