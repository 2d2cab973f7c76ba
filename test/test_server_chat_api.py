"""Issue 32 through the official openai client against real servers on CPU (the trained tiny checkpoint): MTP (eagle,
k=2) and plain decoding give the same greedy text and logprobs under penalties, bias and min_tokens; n choices,
streamed or not; include_stop_str_in_output; a refused field is a 400 naming it."""

import openai
import pytest

from lightllm_mtp.server.launcher import ServerProcess

COMMON = ["--device", "cpu", "--max_req_total_len", "128", "--log_level", "warning", "--running_max_req_size", "8"]
PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def servers(trained_dense_dir, tmp_path_factory):
    mtp_flags = ["--model_dir", str(trained_dense_dir), "--mtp_mode", "eagle_with_att", "--mtp_step", "2", *COMMON]
    plain_flags = ["--model_dir", str(trained_dense_dir), *COMMON]
    logs = tmp_path_factory.mktemp("chat_api")
    with ServerProcess(mtp_flags, logs / "mtp.log") as mtp, ServerProcess(plain_flags, logs / "plain.log") as plain:
        yield {"mtp": mtp, "plain": plain}


def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def complete(server, **kw):
    c = client(server)
    return c.completions.create(model=c.models.list().data[0].id, prompt=PROMPT, temperature=0, **kw)


@pytest.mark.parametrize("extra", [
    {"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.3},
    {"logit_bias": {"11": 3.0}, "min_tokens": 8},
])  # fmt: skip
def test_mtp_equals_plain_with_penalties_and_logprobs(servers, extra):
    outs = {}
    for name, server in servers.items():
        out = complete(server, max_tokens=24, logprobs=2, extra_body={"ignore_eos": True, **extra})
        outs[name] = out.choices[0]
    mtp, plain = outs["mtp"], outs["plain"]
    assert mtp.text == plain.text and mtp.logprobs.tokens == plain.logprobs.tokens
    assert all(abs(a - b) < 1e-4 for a, b in zip(mtp.logprobs.token_logprobs, plain.logprobs.token_logprobs))
    assert len(mtp.logprobs.top_logprobs) == 24 and all(len(t) == 2 for t in mtp.logprobs.top_logprobs)
    base = complete(servers["plain"], max_tokens=24, extra_body={"ignore_eos": True}).choices[0].text
    assert plain.text != base


def test_n_choices_streamed_reassemble_to_the_collected_ones(servers):
    server = servers["mtp"]
    c = client(server)
    model = c.models.list().data[0].id
    kw = dict(model=model, messages=[{"role": "user", "content": "Sort a list."}], max_tokens=12, temperature=0.8,
              seed=5, n=3, logprobs=True, top_logprobs=1)  # fmt: skip
    full = c.chat.completions.create(**kw)
    assert [ch.index for ch in full.choices] == [0, 1, 2] and full.usage.completion_tokens == sum(
        len(ch.logprobs.content) for ch in full.choices)
    texts = ["", "", ""]
    for chunk in c.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            texts[ch.index] += ch.delta.content or ""
    assert texts == [ch.message.content for ch in full.choices]
    assert len(set(texts)) > 1  # seeds s, s+1, s+2


def test_include_stop_str_in_output(servers):
    base = complete(servers["mtp"], max_tokens=24, extra_body={"ignore_eos": True}).choices[0].text
    stop = base[5:8]
    cut = complete(servers["mtp"], max_tokens=24, stop=[stop]).choices[0].text
    kept = complete(servers["mtp"], max_tokens=24, stop=[stop],
                    extra_body={"include_stop_str_in_output": True}).choices[0].text  # fmt: skip
    assert kept == cut + stop and base.startswith(kept)


def test_refused_fields_are_400s_naming_them(servers):
    c = client(servers["plain"])
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=c.models.list().data[0].id, prompt=PROMPT, max_tokens=2, echo=True)
    assert "echo" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        complete(servers["plain"], max_tokens=2, n=2, best_of=3)
    assert "best_of" in str(e.value)


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "kind": {"enum": ["file", "dir"]},
                                           "sizes": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
          "required": ["name", "kind", "sizes"]}  # fmt: skip


def test_structured_outputs_through_the_client(servers):
    import json

    fmt = {"type": "json_schema", "json_schema": {"name": "entry", "schema": SCHEMA, "strict": True}}
    texts = {}
    for name, server in servers.items():
        c = client(server)
        out = c.chat.completions.create(model=c.models.list().data[0].id, temperature=0, max_tokens=80,
                                        messages=[{"role": "user", "content": "Describe a file."}],
                                        response_format=fmt)  # fmt: skip
        texts[name] = out.choices[0].message.content
        value = json.loads(texts[name])
        assert value["kind"] in ("file", "dir") and isinstance(value["sizes"], list) and len(value["name"]) <= 10
    assert texts["mtp"] == texts["plain"]
    for extra, check in [({"guided_choice": ["alpha", "beta"]}, lambda t: t in ("alpha", "beta")),
                         ({"regex": "[0-9]{4}"}, lambda t: len(t) == 4 and t.isdigit()),
                         ({"structured_outputs": {"json_object": True}}, lambda t: isinstance(json.loads(t), dict))]:
        out = complete(servers["mtp"], max_tokens=40, extra_body=extra).choices[0].text
        assert check(out), (extra, out)
    with pytest.raises(openai.BadRequestError) as e:
        complete(servers["mtp"], max_tokens=4, extra_body={"guided_json": "{oops"})
    assert "guided_json" in str(e.value)
