"""The cost of structured outputs under MTP (issue 32's target): per engine step, a JSON schema's host work (bitmask
fills, matcher advance / rollback, the host's choice of drafts) with MTP k=2 vs the same steps without a schema, and
the acceptance (tokens per verify step) with and without it, on the trained tiny fixture.

    python -m benchmark.grammar_cost [--model_dir DIR] [--mtp_step 2] [--batch 4] [--max_tokens 96]
        [--schema_requests N] [--disable_overlap] [--device cuda] [--model_shape qwen3.5-27b] [--pad_vocab V]
        [--out FILE]

Both runs generate greedily from the same prompts with the same MTP settings, to the same number of tokens
(ignore_eos without the schema; the schema run ends at its grammar's end, so its steps are counted, not assumed).
The step time is LLMEngine.step_outputs' wall time over the decode steps (prompt steps left out); the grammar's
share of it is measured directly by timing the engine's grammar calls (engine/grammar_rows.py and the matcher
advance) within those steps, per call too (`grammar_calls`: each one's calls and milliseconds per decode step).
`--pad_vocab 248320` measures Qwen3.5's vocabulary on CPU: the trained tiny model, its vocabulary padded
(benchmark/padded_vocab.py): the grammar's masks, their copies and the logits are that wide.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmark.model_shapes import MODEL_SHAPES
from benchmark.padded_vocab import padded_vocab_checkpoint
from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.engine import grammar_rows
from lightllm_mtp.sampling import grammar as grammar_module
from lightllm_mtp.sampling_params import StructuredOutput
from lightllm_mtp.tools.default_checkpoint import FIXTURES_DIR, TRAINED_CHECKPOINTS

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "kind": {"enum": ["file", "dir", "link"]},
    "size": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
    "owner": {"type": "object", "properties": {"id": {"type": "integer"}, "admin": {"type": "boolean"}},
              "required": ["id", "admin"]}},
    "required": ["name", "kind", "size", "tags", "owner"]}  # fmt: skip
# The engine's grammar calls, timed (their sum is a step's grammar time), and the matcher's calls inside them
TIMED_CALLS = ((grammar_rows, "new_bitmask"), (grammar_module.RequestGrammar, "fill_after"),
               (grammar_module.RequestGrammar, "fill_block"), (grammar_module.RequestGrammar, "advance"),
               (grammar_module.RequestGrammar, "choose_drafts"), (grammar_rows, "row_masks"))  # fmt: skip
MATCHER_CALLS = ("fill_next_token_bitmask", "accept_token", "rollback")
PROMPTS = ["def load(path):\n    return {", "import json\nconfig = ", "# the entry\nresult = ", "data = json.loads("]


class GrammarTimer:
    """Wraps the engine's grammar calls, adding their wall time up (nested calls count once, in `seconds`), per
    call name too."""

    def __init__(self):
        self.seconds = 0.0
        self.calls: dict[str, list] = {}  # name -> [calls, seconds]
        self._depth = 0
        self._undo = []

    def wrap(self, owner, name):
        original = getattr(owner, name)

        entry = self.calls.setdefault(name, [0, 0.0])

        def timed(*args, **kwargs):
            start = time.perf_counter()
            self._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1
                elapsed = time.perf_counter() - start
                entry[0], entry[1] = entry[0] + 1, entry[1] + elapsed
                if not self._depth:
                    self.seconds += elapsed

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def restore(self):
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)


def run(llm: LLM, prompts: list[str], params: SamplingParams | list[SamplingParams]) -> dict:
    engine = llm.engine
    params = params if isinstance(params, list) else [params] * len(prompts)
    done = [engine.add_request(llm._encode(p), s) for p, s in zip(prompts, params)]
    timer = GrammarTimer()
    xgr_matcher = grammar_module.import_xgrammar().GrammarMatcher
    for owner, name in TIMED_CALLS + tuple((xgr_matcher, n) for n in MATCHER_CALLS):
        timer.wrap(owner, name)
    steps, step_s, grammar_s, per_call = 0, 0.0, 0.0, {}
    try:
        while engine.has_unfinished():
            in_prefill = any(r.in_prefill for r in done)
            before, calls_before = timer.seconds, {n: list(c) for n, c in timer.calls.items()}
            start = time.perf_counter()
            engine.step_outputs()
            elapsed = time.perf_counter() - start
            if not in_prefill:
                steps, step_s, grammar_s = steps + 1, step_s + elapsed, grammar_s + timer.seconds - before
                for n, (count, seconds) in timer.calls.items():
                    total = per_call.setdefault(n, [0, 0.0])
                    total[0] += count - calls_before[n][0]
                    total[1] += seconds - calls_before[n][1]
    finally:
        timer.restore()
    tokens = sum(len(r.output_ids) for r in done)
    verify = sum(r.spec_stats.verify_steps for r in done)
    return {"decode_steps": steps, "ms_per_step": 1e3 * step_s / max(steps, 1),
            "grammar_ms_per_step": 1e3 * grammar_s / max(steps, 1),
            "grammar_calls": {n: {"calls_per_step": c / max(steps, 1), "ms_per_step": 1e3 * t / max(steps, 1)}
                              for n, (c, t) in per_call.items() if c},
            "tokens": tokens,
            "tokens_per_verify_step": sum(r.spec_stats.tokens_per_step * r.spec_stats.verify_steps for r in done)
            / max(verify, 1), "texts": [llm._decode(r.output_ids) for r in done]}  # fmt: skip


def shape_with_tokenizer(shape: str, tokenizer_dir: Path) -> Path:
    """A config-only checkpoint of `shape` (random weights) beside `tokenizer_dir`'s tokenizer files."""
    root = Path(tempfile.mkdtemp(prefix="grammar_cost_"))
    for f in tokenizer_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("chat_template.jinja", "generation_config.json"):
            shutil.copy(f, root / f.name)
    (root / "config.json").write_text(json.dumps(MODEL_SHAPES[shape]))
    return root


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model_dir", default=str(FIXTURES_DIR / TRAINED_CHECKPOINTS["qwen3_5"]))
    ap.add_argument("--mtp_step", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max_tokens", type=int, default=96)
    ap.add_argument("--schema_requests", type=int, default=None, help="requests of the schema run that have the "
                    "schema (default: all); the others generate freely in the same batch (a mixed batch: they keep "
                    "their overlap, the schema requests are in every other step)")
    ap.add_argument("--disable_overlap", action="store_true", help="both runs without overlap scheduling (grammar "
                    "requests skip the overlapped step: this isolates the grammar's own cost)")
    ap.add_argument("--model_shape", default=None, choices=sorted(MODEL_SHAPES),
                    help="random weights of this published shape (its 248320-id vocabulary) with --model_dir's "
                         "tokenizer: the logits, the bitmask and its copies are the shape's; the matcher walks the "
                         "tokenizer's ids (the tiny fixture's 4096: fewer than Qwen's, so its host work is a floor)")
    ap.add_argument("--pad_vocab", type=int, default=None, help="--model_dir's checkpoint with its vocabulary padded "
                    "to this many ids (248320: Qwen3.5's), for the host's grammar work at that width on CPU")
    ap.add_argument("--random_weights", action="store_true", help="random weights (load_format dummy) at --model_dir's "
                    "(or --pad_vocab's) shape, as --model_shape has: drafts rarely accepted, long free strings")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    model_dir, extra = a.model_dir, {}
    if a.model_shape is not None and a.pad_vocab is not None:
        ap.error("--model_shape has its own vocabulary: give --pad_vocab without it")
    if a.model_shape is not None:
        model_dir, extra = shape_with_tokenizer(a.model_shape, Path(a.model_dir)), {"load_format": "dummy"}
    if a.pad_vocab is not None:
        model_dir = padded_vocab_checkpoint(Path(a.model_dir), a.pad_vocab)
    if a.random_weights:
        extra = {"load_format": "dummy"}
    llm = LLM(model_dir, max_model_len=256, mtp_mode="eagle_with_att", mtp_step=a.mtp_step, prefix_cache=False,
              disable_overlap=a.disable_overlap, device=a.device, **extra)
    prompts = (PROMPTS * a.batch)[: a.batch]
    so = StructuredOutput("json_schema", json.dumps(SCHEMA))
    run(llm, prompts, SamplingParams(temperature=0.0, max_new_tokens=8, structured=so))  # warm-up (compile)
    free_params = SamplingParams(temperature=0.0, max_new_tokens=a.max_tokens, ignore_eos=True)
    with_schema = a.batch if a.schema_requests is None else a.schema_requests
    schema_params = SamplingParams(temperature=0.0, max_new_tokens=a.max_tokens, structured=so)
    schema = run(llm, prompts, [schema_params] * with_schema + [free_params] * (a.batch - with_schema))
    free = run(llm, prompts, free_params)
    if model_dir != a.model_dir:  # the temporary checkpoint (a padded one is ~0.3 GB)
        shutil.rmtree(model_dir)
    report = {"command": " ".join(["python -m benchmark.grammar_cost", *(argv if argv is not None else sys.argv[1:])]),
              "model_dir": a.model_dir, "model_shape": a.model_shape, "pad_vocab": a.pad_vocab,
              "random_weights": a.random_weights or a.model_shape is not None, "device": a.device,
              "mtp_step": a.mtp_step,
              "batch": a.batch, "max_tokens": a.max_tokens, "schema_requests": with_schema,
              "overlap": not a.disable_overlap,
              "with_schema": schema, "without_schema": free,
              "overhead_ms_per_step": schema["ms_per_step"] - free["ms_per_step"]}  # fmt: skip
    text = json.dumps(report, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
