"""Issue 32 item 3 on the trained fixtures: structured outputs (xgrammar) mask every token choice (plain sampling,
every verify row, every proposer's drafts), so greedy MTP output equals plain decoding under a grammar, JSON
outputs parse and follow their schema, a grammar that ends inside a verify window ends the request there, and a
step whose drafts are all illegal still emits the grammar's tokens."""

import json
import re

import pytest
import torch

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.engine.spec_runner import SpecRunner
from lightllm_mtp.sampling_params import StructuredOutput

MAX_MODEL_LEN = 160
PROMPTS = ["def load(path):\n    return {", "import json\nconfig = ", "# the answer\nresult = "]
SCHEMAS = {
    "nested": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "owner": {"type": "object", "properties": {"id": {"type": "integer"}, "admin": {"type": "boolean"}},
                  "required": ["id", "admin"]}},
        "required": ["name", "owner"]},
    "enum_array": {"type": "object", "properties": {
        "kind": {"enum": ["file", "dir", "link"]},
        "sizes": {"type": "array", "items": {"type": "integer"}, "maxItems": 4}},
        "required": ["kind", "sizes"]},
}  # fmt: skip
MTP_MODES = {
    "eagle2": dict(mtp_mode="eagle_with_att", mtp_step=2),
    "multi_layer3": dict(mtp_mode="vanilla_with_att", mtp_step=3),
    "ptd3": dict(mtp_mode="eagle_with_att", mtp_step=3, parallel_drafting=True),
}


def follows(value, schema) -> bool:
    """The subset of JSON schema used here: type, properties, required, enum, items, maxItems, maxLength."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind == "object":
        return (isinstance(value, dict) and all(k in value for k in schema.get("required", []))
                and all(follows(value[k], s) for k, s in schema.get("properties", {}).items() if k in value))
    if kind == "array":
        return (isinstance(value, list) and len(value) <= schema.get("maxItems", len(value))
                and all(follows(v, schema["items"]) for v in value))  # fmt: skip
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
    return {"integer": int, "boolean": bool}[kind] is type(value)


def greedy(so: StructuredOutput, n=80):
    return SamplingParams(temperature=0.0, max_new_tokens=n, structured=so)


def schema_output(name):
    return StructuredOutput("json_schema", json.dumps(SCHEMAS[name]))


@pytest.fixture(scope="module")
def plain(trained_mtp3_ptd_dir):
    return LLM(trained_mtp3_ptd_dir, max_model_len=MAX_MODEL_LEN)


@pytest.mark.parametrize("schema", list(SCHEMAS))
def test_json_outputs_follow_their_schema(plain, schema):
    outs = plain.generate(PROMPTS, greedy(schema_output(schema)))
    for o in outs:
        assert o.finish_reason == "stop", o.text
        assert follows(json.loads(o.text), SCHEMAS[schema]), o.text
    sampled = SamplingParams(temperature=1.0, max_new_tokens=80, seed=3, structured=schema_output(schema))
    for o in plain.generate(PROMPTS, sampled):
        assert o.finish_reason == "length" or follows(json.loads(o.text), SCHEMAS[schema]), o.text
    obj = plain.generate(PROMPTS[:1], greedy(StructuredOutput("json_object")))[0]
    assert isinstance(json.loads(obj.text), dict)


@pytest.mark.parametrize("mode", list(MTP_MODES))
def test_mtp_greedy_equals_plain_under_a_schema(plain, trained_mtp3_ptd_dir, mode):
    params = [greedy(schema_output(s)) for s in ("nested", "enum_array", "nested")]
    expect = [o.token_ids for o in plain.generate(PROMPTS, params)]
    outs = LLM(trained_mtp3_ptd_dir, max_model_len=MAX_MODEL_LEN, **MTP_MODES[mode]).generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == expect
    assert sum(o.spec.accepted_drafts for o in outs) > 0  # masked drafts keep being accepted


def test_draft_model_greedy_equals_plain_under_a_schema(trained_dense_dir, trained_draft_dir):
    params = greedy(schema_output("enum_array"))
    expect = LLM(trained_dense_dir, max_model_len=MAX_MODEL_LEN).generate(PROMPTS, params)
    llm = LLM(trained_dense_dir, max_model_len=MAX_MODEL_LEN, mtp_mode="draft_model", mtp_step=2,
              mtp_draft_model_dir=str(trained_draft_dir))  # fmt: skip
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == [o.token_ids for o in expect]


def test_a_grammar_that_ends_inside_the_window(plain, trained_mtp3_ptd_dir):
    """k = 3: two digits then eos, so the eos row lies inside a verify block (or right after the prompt)."""
    params = [greedy(StructuredOutput("regex", "[0-9]{2}")), greedy(StructuredOutput("choice", '["yes", "no"]'))]
    expect = plain.generate(PROMPTS[:2], params)
    for mode in ("eagle2", "multi_layer3"):
        outs = LLM(trained_mtp3_ptd_dir, max_model_len=MAX_MODEL_LEN, **MTP_MODES[mode]).generate(PROMPTS[:2], params)
        assert [o.token_ids for o in outs] == [o.token_ids for o in expect]
        assert re.fullmatch("[0-9]{2}", outs[0].text) and outs[1].text in ("yes", "no")
        assert all(o.finish_reason == "stop" for o in outs)


def test_every_draft_illegal(monkeypatch, plain, trained_mtp3_ptd_dir):
    """The proposer's drafts and the candidates it keeps for the host's choice (sampling/draft_choice.py) replaced by
    a token the grammar never allows: no draft is kept (the digits the grammar allows are several: it forces none),
    each step emits the target's grammar token, and the output equals plain decoding's."""
    from lightllm_mtp.engine import spec_runner

    bad = plain.tokenizer.encode("zz", add_special_tokens=False)[0]
    propose, keep = SpecRunner._drafts_on_every_stage, spec_runner.kept_candidates

    def illegal(self, fn, num_reqs):
        drafts = propose(self, fn, num_reqs)
        return torch.full_like(drafts, bad)

    def illegal_candidates(chooser, num_draft_tokens):
        kept = keep(chooser, num_draft_tokens)
        return None if kept is None else torch.full_like(kept, bad)

    monkeypatch.setattr(SpecRunner, "_drafts_on_every_stage", illegal)
    monkeypatch.setattr(spec_runner, "kept_candidates", illegal_candidates)
    params = greedy(StructuredOutput("regex", "[0-9]{6}"), n=6)  # ends before the grammar forces its eos
    expect = plain.generate(PROMPTS, params)
    outs = LLM(trained_mtp3_ptd_dir, max_model_len=MAX_MODEL_LEN, **MTP_MODES["eagle2"]).generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expect]
    assert all(re.fullmatch("[0-9]{6}", o.text) for o in outs)
    assert sum(o.spec.accepted_drafts for o in outs) == 0 and all(o.spec.verify_steps > 0 for o in outs)


def test_invalid_grammars_are_refused_before_queuing(plain):
    for so in (StructuredOutput("json_schema", "{nope"), StructuredOutput("regex", "(["),
               StructuredOutput("choice", "[]"), StructuredOutput("grammar", "root ::= ")):  # fmt: skip
        with pytest.raises(ValueError, match="invalid"):
            plain.generate(PROMPTS[:1], greedy(so))
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(ignore_eos=True, structured=StructuredOutput("json_object"))


def test_reduced_draft_vocabulary_under_a_schema(monkeypatch, plain, trained_mtp3_ptd_dir, tmp_path):
    """The draft logits cover a quarter of the ids: the grammar's mask is taken at those ids (token_map), drafts come
    from the subset, and the output equals plain decoding's."""
    from lightllm_mtp.spec_decode.draft_state import DraftState
    from lightllm_mtp.spec_decode.draft_vocab import load_draft_vocab
    from lightllm_mtp.tools.build_draft_vocab import build
    from lightllm_mtp.tools.tiny_corpus import split_corpus

    data = build(trained_mtp3_ptd_dir, [f.text for f in split_corpus().train[:40]], "40 stdlib files")
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps(data))
    size = data["vocab_size"] // 4
    drafted = []
    real = DraftState.write_drafts

    def recording(self, b_req_idx, drafts):
        drafted.append(drafts.clone())
        return real(self, b_req_idx, drafts)

    params = greedy(schema_output("enum_array"))
    expect = [o.token_ids for o in plain.generate(PROMPTS, params)]
    monkeypatch.setattr(DraftState, "write_drafts", recording)
    llm = LLM(trained_mtp3_ptd_dir, max_model_len=MAX_MODEL_LEN, mtp_draft_vocab_file=str(path),
              mtp_draft_vocab_size=size, **MTP_MODES["eagle2"])  # fmt: skip
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == expect and sum(o.spec.accepted_drafts for o in outs) > 0
    subset = set(load_draft_vocab(path, size, data["vocab_size"], llm.engine.model_config.eos_token_ids).tolist())
    assert set(torch.cat(drafted).flatten().tolist()) <= subset


@pytest.mark.parametrize("mode", ["eagle2", "multi_layer3", "ptd3"])
def test_a_grammar_that_starts_after_a_marker_inside_the_window(plain, trained_mtp3_ptd_dir, mode):
    """A reasoning end as the grammar's start (StructuredOutput.starts_after), here text the model writes by itself
    (the first 5 / 7 tokens of its free greedy continuation), so the marker ends inside verify blocks: the output up
    to the marker is free, the rest follows the schema, and MTP equals plain decoding."""
    prompts = PROMPTS[:2]
    free = plain.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True))
    markers = [plain.tokenizer.decode(o.token_ids[:n]) for o, n in zip(free, (5, 7))]
    params = [SamplingParams(temperature=0.0, max_new_tokens=60, structured=StructuredOutput(
        "json_schema", json.dumps(SCHEMAS["enum_array"]), starts_after=m)) for m in markers]  # fmt: skip
    expect = plain.generate(prompts, params)
    for o, m in zip(expect, markers):
        assert m in o.text, o.text
        head, tail = o.text.split(m, 1)
        assert follows(json.loads(tail), SCHEMAS["enum_array"]), o.text
    outs = LLM(trained_mtp3_ptd_dir, max_model_len=MAX_MODEL_LEN, **MTP_MODES[mode]).generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expect]
    assert sum(o.spec.accepted_drafts for o in outs) > 0


def test_speculative_sampling_under_a_grammar_is_exact(trained_mtp3_ptd_dir):
    """Temperature 1, top-k 3, a regex of three digits: the joint distribution of the answers under MTP (eagle k=2,
    masked drafts, masked verify rows) equals plain sampling's (chi-square homogeneity, p > 1e-3)."""
    from unit_tests.spec_decode.test_trained_drafting import _chi2_homogeneity_p

    params = SamplingParams(temperature=1.0, top_k=3, max_new_tokens=8, structured=StructuredOutput("regex", "[0-9]{3}"))

    def counts(**mtp):
        torch.manual_seed(0)
        out: dict[str, int] = {}
        llm = LLM(trained_mtp3_ptd_dir, max_model_len=64, max_batch_size=64, **mtp)
        for o in llm.generate([PROMPTS[2]] * 500, params):
            assert re.fullmatch("[0-9]{3}", o.text), o.text
            out[o.text] = out.get(o.text, 0) + 1
        return out

    plain, spec = counts(), counts(**MTP_MODES["eagle2"])
    assert len(plain) > 5 and _chi2_homogeneity_p(plain, spec) > 1e-3, (plain, spec)
