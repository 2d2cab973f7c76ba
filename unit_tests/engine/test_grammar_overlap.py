"""Issue 32: a grammar request under MTP never makes a launch wait for the device (overlap scheduling keeps working for
every request of the batch), its drafts are what masking the draft logits would choose, and a batch mixing a grammar
request with a free one gives each exactly its solo plain output.

A launch that reads a device value back (`tolist`, `item`, ...) makes the host wait for everything queued before it,
the step in flight included. On the CPU nothing waits, so the tests count such read-backs made by the
engine's own code during `launch` (the CPU reference paths of kernels/ are left out: on the GPU they are Triton)."""

import json
import traceback
from collections import Counter
from pathlib import Path

import pytest
import torch

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.engine.model_runner import ModelRunner
from lightllm_mtp.engine.spec_runner import SpecRunner
from lightllm_mtp.sampling.grammar import new_bitmask, row_masks
from lightllm_mtp.sampling.grammar_compiler import GrammarCompiler
from lightllm_mtp.sampling_params import StructuredOutput

MAX_MODEL_LEN = 160
SCHEMA = StructuredOutput("json_schema", json.dumps({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10}, "kind": {"enum": ["file", "dir", "link"]},
    "sizes": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}}, "required": ["name", "kind", "sizes"]}))
PROMPTS = ["import json\nconfig = ", "def fibonacci(n):"]  # the grammar request's, the free one's
MODES = {
    "eagle2": dict(mtp_mode="eagle_with_att", mtp_step=2),
    "multi_layer3": dict(mtp_mode="vanilla_with_att", mtp_step=3),
    "ptd3": dict(mtp_mode="eagle_with_att", mtp_step=3, parallel_drafting=True),
}
READ_BACKS = ("tolist", "item", "numpy", "cpu")  # (__bool__ / __int__: the host allocators' own tensors use them)
PACKAGE = Path(__file__).resolve().parents[2] / "lightllm_mtp"


class ReadBackCounter:
    """Counts tensor read-backs made by lightllm_mtp's code (outside kernels/) while a runner's `launch` runs."""

    def __init__(self, monkeypatch):
        self.inside = False
        self.calls: Counter = Counter()
        for name in READ_BACKS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name)))
        for cls in (SpecRunner, ModelRunner):
            monkeypatch.setattr(cls, "launch", self._inside(cls.launch))

    def _counted(self, original):
        def read(tensor, *args, **kwargs):
            if self.inside:
                caller = Path(traceback.extract_stack(limit=2)[0].filename).resolve()
                if caller.is_relative_to(PACKAGE) and not caller.is_relative_to(PACKAGE / "kernels"):
                    self.calls[f"{caller.relative_to(PACKAGE)}:{original.__name__}"] += 1
            return original(tensor, *args, **kwargs)

        return read

    def _inside(self, launch):
        def counted(runner, *args, **kwargs):
            self.inside = True
            try:
                return launch(runner, *args, **kwargs)
            finally:
                self.inside = False

        return counted


def greedy(**kw):
    return SamplingParams(temperature=0.0, max_new_tokens=40, **kw)


@pytest.fixture(scope="module")
def plain(trained_mtp3_ptd_dir):
    return LLM(trained_mtp3_ptd_dir, max_model_len=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def solo(plain):
    """Each request of the mixed batch alone, plain decoding: the oracle."""
    params = [greedy(structured=SCHEMA), greedy(ignore_eos=True)]
    return [plain.generate([p], s)[0].token_ids for p, s in zip(PROMPTS, params)]


@pytest.mark.parametrize("mode", ["plain", *MODES])
def test_a_mixed_batch_with_a_grammar_reads_nothing_back_in_its_launches(monkeypatch, plain, solo,
                                                                         trained_mtp3_ptd_dir, mode):  # fmt: skip
    """Overlap on (the default): no launch reads a device value, and the free request is queued in the steps
    launched while the grammar request's step is in flight; both outputs equal their solo plain runs."""
    llm = plain if mode == "plain" else LLM(trained_mtp3_ptd_dir, max_model_len=MAX_MODEL_LEN, **MODES[mode])
    counter = ReadBackCounter(monkeypatch)
    overlapped: list[set[int]] = []
    launch_next = LLMEngine._launch_next

    def recording(engine, step):
        queued = launch_next(engine, step)
        overlapped.append({r.request_id for r in queued.reqs} if queued is not None else set())
        return queued

    monkeypatch.setattr(LLMEngine, "_launch_next", recording)
    engine = llm.engine
    structured = engine.add_request(llm.tokenizer.encode(PROMPTS[0]), greedy(structured=SCHEMA))
    free = engine.add_request(llm.tokenizer.encode(PROMPTS[1]), greedy(ignore_eos=True))
    while engine.has_unfinished():
        engine.step_outputs()
    assert not counter.calls, dict(counter.calls)
    assert [structured.output_ids, free.output_ids] == solo
    assert sum(free.request_id in ids for ids in overlapped) >= 4


def test_the_grammar_drafts_are_the_masked_argmax(trained_mtp3_ptd_dir):
    """RequestGrammar.choose_drafts on each position's best candidates equals the old device path, the argmax of the
    masked draft logits position after position, as long as that argmax is among the candidates (16 here) or is the
    only token allowed; it stops where neither holds. Random draft logits, boosted at legal ids so all cases
    occur."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained_mtp3_ptd_dir)
    vocab = len(tokenizer)
    compiler = GrammarCompiler(lambda: tokenizer, vocab, [tokenizer.eos_token_id])
    gen = torch.Generator().manual_seed(0)
    k, n, checked, stopped, forced = 4, 16, 0, 0, 0
    for so in (SCHEMA, StructuredOutput("regex", "[0-9a-f]{3}-[0-9]{2}")):
        grammar = compiler.matcher(so)
        for step in range(16):
            logits = torch.randn(k, vocab, generator=gen)
            expect = []
            for j in range(k):
                bitmask = new_bitmask(1, vocab)
                grammar.fill_after(expect, bitmask, 0)
                allowed = row_masks(bitmask, vocab, torch.device("cpu")).allowed[0]
                legal = allowed.nonzero().flatten()
                if step % 3:  # a legal id among the best most of the time
                    boost = legal[torch.randint(len(legal), (1,), generator=gen)]
                    logits[j, boost] += 6.0
                best = logits[j].masked_fill(~allowed, float("-inf")).argmax().item()
                commit = best if j == 0 else commit
                if best not in logits[j].topk(n).indices.tolist() and len(legal) > 1:
                    stopped += 1
                    break
                forced += len(legal) == 1
                expect.append(best)
                if best == tokenizer.eos_token_id:  # the grammar's end: what follows is never emitted
                    break
            chosen = grammar.choose_drafts(logits.topk(n, dim=-1).indices.tolist())
            ended = expect[-1:] == [tokenizer.eos_token_id]
            assert (chosen[: len(expect)] if ended else chosen) == expect, (so.kind, step)
            checked += len(chosen)
            grammar.advance(commit)  # the target's token, as a verify with a rejected first draft emits
            if grammar.matcher.is_terminated():
                break
    assert checked > 10 and stopped > 2 and forced > 2, (checked, stopped, forced)
