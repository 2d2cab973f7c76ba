"""Forced acceptance on CUDA with the verify / draft graphs: the measured mean accept length against the requested
one, and greedy MTP == plain without it, on the trained tiny multi-module fixture (quick smoke check).

    python benchmark/check_forced_acceptance_gpu.py --out result.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightllm_mtp import LLM, SamplingParams  # noqa: E402

MODEL = "fixtures/tiny_qwen3_5_mtp3_ptd_trained"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mean", type=float, default=2.5)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    command = "python " + " ".join(sys.argv if argv is None else ["benchmark/check_forced_acceptance_gpu.py", *argv])
    prompts = [[1 + (7 * i + j) % 500 for j in range(32)] for i in range(16)]
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    common = dict(device="cuda", max_model_len=256, max_batch_size=16, mtp_mode="eagle_with_att", mtp_step=3)
    forced = LLM(MODEL, mtp_force_acceptance=f"mean={args.mean}", **common).generate(prompts, params)
    steps = sum(o.spec.verify_steps for o in forced)
    accepted = sum(o.spec.accepted_drafts for o in forced)
    plain = LLM(MODEL, device="cuda", max_model_len=256, max_batch_size=16).generate(prompts, params)
    mtp = LLM(MODEL, **common).generate(prompts, params)
    result = {"command": command, "requested_mean": args.mean, "verify_steps": steps,
              "measured_mean": 1 + accepted / max(1, steps),
              "mtp_equals_plain": [o.token_ids for o in mtp] == [o.token_ids for o in plain]}  # fmt: skip
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
