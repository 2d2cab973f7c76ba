"""Structured outputs under tp / pp (issue 32; gloo, CPU processes). Every rank that chooses tokens (each tp rank, the
last pipeline stage) compiles the request's grammar and keeps a matcher over its request mirror's committed output
(engine/parallel/follower.py), so the masks of every sampled row, verify row and draft equal the driver's: greedy
tokens equal one process's, plain and with eagle k=2, the JSON parses and follows its schema, and a grammar that does
not compile ends only its own request. Multi-layer MTP under pp too: the last stage chooses the grammar drafts on the
host (engine/grammar_rows.py) and every stage must verify those, the first stage embedding them."""

import json
import re

import pytest
from transformers import AutoTokenizer

from lightllm_mtp.engine.request import FinishReason
from lightllm_mtp.sampling_params import SamplingParams, StructuredOutput
from lightllm_mtp.tools.default_checkpoint import complete_checkpoint
from unit_tests.parallel.workload import DENSE, MTP3, engine
from unit_tests.spec_decode.test_structured_outputs_mtp import SCHEMAS, follows

EAGLE = dict(mtp_mode="eagle_with_att", mtp_step=2)
VANILLA = dict(mtp_mode="vanilla_with_att", mtp_step=3)
DIGITS = re.compile("[0-9]{2}\\.[0-9]")
REQUESTS = [  # (prompt, params, how to check the text)
    ("def load(path):\n    return {", "json_schema", json.dumps(SCHEMAS["nested"]), "nested"),
    ("import json\nconfig = ", "json_schema", json.dumps(SCHEMAS["enum_array"]), "enum_array"),
    ("# the answer\nresult = ", "regex", DIGITS.pattern, DIGITS),
    ("x = ", "choice", '["alpha", "beta", "gamma"]', re.compile("alpha|beta|gamma")),
]
REQUESTS = [(prompt, SamplingParams(temperature=0, max_new_tokens=60, structured=StructuredOutput(kind, spec)), rule)
            for prompt, kind, spec, rule in REQUESTS]  # fmt: skip
# temperature sampling: every rank draws with the same generator from the same masked logits
REQUESTS.append(("value = ", SamplingParams(temperature=1.0, seed=5, max_new_tokens=20,
                                            structured=StructuredOutput("regex", DIGITS.pattern)), DIGITS))  # fmt: skip
BAD = StructuredOutput("json_schema", '{"type": "object", "properties": {"a": {"type": "nope"}}}')
LAYOUTS = [(DENSE, 2, 1, {}), (DENSE, 2, 1, EAGLE), (DENSE, 1, 2, {}), (DENSE, 1, 2, EAGLE), (DENSE, 2, 2, EAGLE),
           (MTP3, 1, 2, VANILLA)]  # fmt: skip
LAYOUT_IDS = ["tp2-plain", "tp2-eagle2", "pp2-plain", "pp2-eagle2", "tp2-pp2-eagle2-cache", "mtp3-pp2-vanilla3"]


def generate(eng, tokenizer, requests) -> list[tuple[list[int], str]]:
    reqs = [eng.add_request(tokenizer.encode(prompt), params) for prompt, params, _ in requests]
    while eng.has_unfinished():
        eng.step_outputs()
    return [(list(r.output_ids), r.finish_reason.value) for r in reqs]


def check_texts(tokenizer, outputs, requests) -> None:
    for (ids, reason), (_, _, rule) in zip(outputs, requests):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        assert reason == "stop", text
        if isinstance(rule, str):
            assert follows(json.loads(text), SCHEMAS[rule]), text
        else:
            assert rule.fullmatch(text), text


_reference: dict = {}


def reference(mtp: dict, model_dir=DENSE) -> list[tuple[list[int], str]]:
    key = (model_dir, tuple(sorted(mtp.items())))
    if key not in _reference:
        _reference[key] = generate(engine(model_dir, mtp), AutoTokenizer.from_pretrained(model_dir), REQUESTS)
    return _reference[key]


@pytest.mark.parametrize("model_dir, tp, pp, mtp", LAYOUTS, ids=LAYOUT_IDS)
def test_grammars_under_tp_and_pp_equal_one_process(model_dir, tp, pp, mtp):
    """Masked sampling, verify rows and drafts on the ranks that choose tokens (the last stage under pp): the one
    process's tokens; the texts follow their grammars. tp=2 x pp=2: the first stage's ranks hold no matcher; the
    prefix cache on (requests reach the followers with the cache's Match, before their launch)."""
    if complete_checkpoint(model_dir) is None:
        pytest.skip(f"trained checkpoint not there complete at {model_dir} (recipe: fixtures/README.md)")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    want = reference(mtp, model_dir)
    check_texts(tokenizer, want, REQUESTS)
    eng = engine(model_dir, mtp, tp=tp, pp=pp, prefix_cache=tp * pp > 2)
    try:
        got = generate(eng, tokenizer, REQUESTS)
    finally:
        eng.shutdown()
    assert got == want


def test_a_bad_grammar_under_tp_ends_only_its_request():
    """tp=2, eagle k=2: a grammar that does not compile arrives before the others and among later ones: its request
    ends with an error (no tokens), the others are served as by one process, and the engine keeps serving."""
    tokenizer = AutoTokenizer.from_pretrained(DENSE)
    want = reference(EAGLE)
    eng = engine(DENSE, EAGLE, tp=2)
    try:
        bad = eng.add_request(tokenizer.encode("y = "), SamplingParams(temperature=0, structured=BAD))
        got = generate(eng, tokenizer, REQUESTS)
        assert bad.finish_reason is FinishReason.ERROR and "did not compile" in bad.error and not bad.output_ids
        again = generate(eng, tokenizer, [REQUESTS[1], ("z = ", SamplingParams(temperature=0, structured=BAD), None)])
    finally:
        eng.shutdown()
    assert got == want
    assert again == [want[1], ([], "error")]
