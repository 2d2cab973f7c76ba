"""train_tiny at toy size on CPU: losses, checkpoint layout, engine loading, and the MTP math against the engine."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.models.mtp_retarget import MtpWeightRetargetMixin
from training.train_tiny import parse_args, train
from training.trainable_mtp import load_tiny_mtp_model

TOY = ["--hidden_size", "64", "--num_hidden_layers", "4", "--seq_len", "48", "--batch_size", "4",
       "--vocab_size", "1024", "--corpus_chars", "150000", "--eval_windows", "4", "--log_every", "1",
       "--no_progress_bar"]  # fmt: skip
PROMPTS = [[5, 17, 300, 42, 9, 77, 1000, 3, 58, 600, 11, 12, 13], [900, 4, 4, 250], [31, 8, 222, 150, 64, 2, 7]]
MAX_NEW = [14, 6, 9]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """arch -> (in-memory model, log, checkpoint dir): dense saved in fp32, MoE in bf16."""
    runs = {}
    for arch, dtype in (("qwen3_5", "fp32"), ("qwen3_5_moe", "bf16")):
        out = tmp_path_factory.mktemp(arch)
        model, log = train(parse_args(["--arch", arch, "--out", str(out), "--steps", "4", "--dtype_save", dtype, *TOY]))
        runs[arch] = (model, log, out)
    return runs


def shard_tensors(model_dir: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    out = {}
    for shard in model_dir.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            for name in f.keys():
                out[name] = (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype())
    return out


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_5_moe"])
def test_checkpoint_layout_config_and_log(trained, arch):
    _, log, out = trained[arch]
    tensors = shard_tensors(out)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(tensors)
    assert tensors["mtp.fc.weight"][0] == (64, 128)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        assert tensors[f"mtp.{name}.weight"][0] == (64,)
    mtp_layer = {n.removeprefix("mtp.layers.0.") for n in tensors if n.startswith("mtp.layers.0.")}
    main_full = {n.removeprefix("model.language_model.layers.3.") for n in tensors if ".layers.3." in n}
    assert mtp_layer == main_full and "self_attn.q_norm.weight" in mtp_layer  # a full-attention decoder layer
    assert not any(n.startswith("mtp.") and ("embed_tokens" in n or "lm_head" in n) for n in tensors)
    assert "lm_head.weight" in tensors and any(n.startswith("model.visual.") for n in tensors)
    if arch == "qwen3_5_moe":
        assert tensors["mtp.layers.0.mlp.experts.7.gate_proj.weight"][0] == (16, 64)
        assert {dtype for _, dtype in tensors.values()} == {"BF16"}
    else:
        assert {dtype for _, dtype in tensors.values()} == {"F32"}
    cfg = json.loads((out / "config.json").read_text())
    text = cfg["text_config"]
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert text["mtp_num_hidden_layers"] == 1 and text["vocab_size"] == 1024
    assert (text["linear_num_key_heads"], text["linear_num_value_heads"], text["num_key_value_heads"]) == (2, 4, 2)
    assert (out / "tokenizer.json").is_file()
    saved = json.loads((out / "train_log.json").read_text())
    assert saved["command"].startswith("python -m training.train_tiny --arch " + arch)
    assert saved["python"] and saved["corpus"]["heldout_files"] and len(saved["curve"]) == 4
    for point in saved["curve"] + [saved["heldout_final"]]:
        assert math.isfinite(point["main_loss"]) and math.isfinite(point["mtp_loss"])
    assert saved["heldout_final"] == log["heldout_final"]
    assert ("balance_loss" in saved["curve"][0]) == (arch == "qwen3_5_moe")


def test_losses_fall_on_one_fixed_batch(tmp_path):
    args = ["--arch", "qwen3_5", "--out", str(tmp_path), "--steps", "20", "--overfit_batch", "--lr", "3e-3", *TOY]
    _, log = train(parse_args(args + ["--warmup_steps", "2"]))
    first, last = log["curve"][0], log["curve"][-1]
    assert last["main_loss"] < 0.7 * first["main_loss"]
    assert last["mtp_loss"] < 0.8 * first["mtp_loss"]


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_5_moe"])
def test_engine_loads_and_mtp_greedy_equals_plain(trained, arch):
    out = trained[arch][2]
    params = [SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True) for n in MAX_NEW]
    plain = [o.token_ids for o in LLM(out, max_model_len=64).generate(PROMPTS, params)]
    llm = LLM(out, max_model_len=64, mtp_mode="eagle_with_att", mtp_step=2, chunked_prefill_size=8)
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == plain
    assert all(o.spec.verify_steps > 0 for o in outs)


def record_first_draft_pass(monkeypatch):
    calls = []
    original = MtpWeightRetargetMixin.forward

    def recording(self, batch, main_hidden):
        out = original(self, batch, main_hidden)
        calls.append((batch.input_ids.clone(), main_hidden.clone(), out.hidden.clone(), out.logits.clone()))
        return out

    monkeypatch.setattr(MtpWeightRetargetMixin, "forward", recording)
    return calls


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_5_moe"])
def test_training_mtp_head_computes_the_engine_draft(trained, arch, monkeypatch):
    """The prompt's draft pass in the engine reads (h_t, x_{t+1}) for every prompt row; the training module's MTP
    head on the same sequence must give the same hidden and logits (same norms, concat order, positions)."""
    model, _, out = trained[arch]
    if arch == "qwen3_5_moe":  # saved in bf16: compare with the weights as saved (and the reload path)
        model = load_tiny_mtp_model(out)
    prompt = PROMPTS[0]
    first = LLM(out, max_model_len=64).generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=1))
    calls = record_first_draft_pass(monkeypatch)
    LLM(out, max_model_len=64, mtp_mode="eagle_with_att", mtp_step=1).generate(
        [prompt], SamplingParams(temperature=0.0, max_new_tokens=2, ignore_eos=True)
    )
    input_ids, engine_hidden, engine_mtp_hidden, engine_logits = calls[0]
    sequence = torch.tensor([prompt + first[0].token_ids + [0]])  # the final 0 only pads the [B, T + 2] layout
    assert input_ids.tolist() == sequence[0, 1:-1].tolist()
    with torch.no_grad():
        result = model.float().eval()(sequence)
        hidden = model.lm.model(input_ids=sequence[:, :-2]).last_hidden_state[0]
        mtp_hidden = model.mtp(model.lm.model.embed_tokens(sequence[:, 1:-1]), hidden[None])[0]
    torch.testing.assert_close(engine_hidden, hidden, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(engine_mtp_hidden, mtp_hidden, atol=2e-5, rtol=1e-4)
    rows = len(engine_logits)  # the engine keeps the logits of the last rows only
    torch.testing.assert_close(engine_logits, result["mtp_logits"][0, -rows:], atol=1e-4, rtol=1e-4)


def test_reloaded_checkpoint_equals_the_trained_model(trained):
    model, _, out = trained["qwen3_5"]
    reloaded = load_tiny_mtp_model(out)
    state, again = model.state_dict(), reloaded.state_dict()
    assert state.keys() == again.keys()
    for name in [n for n in state if not (n.startswith("mtp.stacks.") and ".embed_tokens." in n)]:  # unused
        assert torch.equal(state[name].float(), again[name]), name


def test_eval_acceptance_on_the_toy_checkpoint(trained, tmp_path):
    from lightllm_mtp.tools.eval_acceptance import main

    out = trained["qwen3_5"][2]
    args = ["--model_dir", str(out), "--num_prompts", "3", "--prompt_tokens", "20", "--max_new_tokens", "9",
            "--mtp_steps", "1", "3", "--strict", "--out", str(tmp_path / "acc.json")]  # fmt: skip
    result = main(args)
    assert json.loads((tmp_path / "acc.json").read_text()) == json.loads(json.dumps(result))
    assert result["prompts"]["count"] == 3 and len(result["samples"]) == 3
    for k in ("1", "3"):
        stats = result["mtp"][k]
        assert stats["greedy_equal"] and stats["verify_steps"] > 0 and len(stats["acceptance_per_position"]) == int(k)
        assert stats["tokens_per_step"] == pytest.approx(1 + stats["accepted_per_step"], abs=1e-3)
        assert all(0 <= a <= 1 for a in stats["acceptance_per_position"])


def test_eval_heldout_on_the_toy_checkpoint(trained, tmp_path):
    """training/eval_heldout.py: the held-out losses of a saved checkpoint equal the training run's own evaluation
    of the same windows."""
    from training.eval_heldout import main

    _, log, out = trained["qwen3_5"]  # saved in fp32: the same weights as the run's last evaluation
    result = main(["--model_dir", str(out), "--windows", "4", "--seq_len", "48", "--out", str(tmp_path / "h.json")])
    assert json.loads((tmp_path / "h.json").read_text()) == json.loads(json.dumps(result))
    heldout = result.pop("heldout")
    assert heldout.pop("windows") == 4 and heldout.pop("seq_len") == 48  # TOY's --eval_windows and --seq_len
    assert heldout == pytest.approx(log["heldout_final"], abs=2e-4)
    assert result["command"].startswith("python -m training.eval_heldout --model_dir ")


def test_acceptance_sums_the_counts_of_every_request():
    from lightllm_mtp.engine.llm import RequestOutput
    from lightllm_mtp.spec_decode.stats import SpecStats
    from lightllm_mtp.tools.eval_acceptance import aggregate

    def output(steps, accepted_at):
        spec = SpecStats(steps, 2 * steps, sum(accepted_at), (steps, steps), accepted_at)
        return RequestOutput([1], [2], "", "length", spec)

    stats = aggregate([output(30, (27, 18)), output(10, (5, 0))])
    assert stats["verify_steps"] == 40
    assert stats["accepted_per_step"] == pytest.approx((30 * 1.5 + 10 * 0.5) / 40)
    assert stats["tokens_per_step"] == pytest.approx(1 + (30 * 1.5 + 10 * 0.5) / 40)
    assert stats["acceptance_per_position"] == pytest.approx([(27 + 5) / 40, 18 / 40])
    with pytest.raises(ValueError, match="no verify step"):
        aggregate([output(0, (0, 0))])


@pytest.fixture(scope="module")
def trained_multi(tmp_path_factory):
    """A toy dense model with 3 MTP modules and parallel-drafting mask inputs, saved in fp32."""
    out = tmp_path_factory.mktemp("multi")
    args = ["--arch", "qwen3_5", "--out", str(out), "--steps", "3", "--dtype_save", "fp32", "--mtp_layers", "3",
            "--ptd", "--ptd_anchors", "2", *TOY]  # fmt: skip
    model, log = train(parse_args(args))
    return model, log, out


def test_multi_layer_and_ptd_checkpoint(trained_multi):
    model, log, out = trained_multi
    tensors = shard_tensors(out)
    for m in range(3):
        assert tensors[f"mtp.layers.{m}.self_attn.q_norm.weight"][0] == (32,)
    assert tensors["mtp.mask_embedding"][0] == tensors["mtp.mask_hidden"][0] == (64,)
    assert json.loads((out / "config.json").read_text())["text_config"]["mtp_num_hidden_layers"] == 3
    for point in log["curve"]:
        assert all(math.isfinite(point[k]) for k in ("mtp_loss", "mtp_loss_1", "mtp_loss_2", "ptd_loss"))
    reloaded = load_tiny_mtp_model(out)
    state, again = model.state_dict(), reloaded.state_dict()
    for name in [n for n in state if not (n.startswith("mtp.stacks.") and ".embed_tokens." in n)]:
        assert torch.equal(state[name].float(), again[name]), name
    params = [SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True) for n in MAX_NEW]
    plain = [o.token_ids for o in LLM(out, max_model_len=64).generate(PROMPTS, params)]
    for spec in (dict(mtp_mode="vanilla_with_att", mtp_step=3), dict(mtp_mode="eagle_with_att", mtp_step=4,
                                                                      parallel_drafting=True)):  # fmt: skip
        outs = LLM(out, max_model_len=64, chunked_prefill_size=8, **spec).generate(PROMPTS, params)
        assert [o.token_ids for o in outs] == plain


def test_training_modules_compute_the_engine_drafts(trained_multi, monkeypatch):
    """Multi-layer: the engine's prompt pass of module m (rows whose tokens are all in the prompt) equals the
    training chain. Parallel drafting: the engine's mask rows after the last prompt row equal the training's
    masked forward of module 0 over the prompt's context."""
    model, _, out = trained_multi
    prompt = PROMPTS[0]
    n = len(prompt)
    calls = record_first_draft_pass(monkeypatch)
    LLM(out, max_model_len=64, mtp_mode="vanilla_with_att", mtp_step=3).generate(
        [prompt], SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True)
    )
    sequence = torch.tensor([prompt])
    embed = model.lm.model.embed_tokens
    with torch.no_grad():
        hidden = model.lm.model(input_ids=sequence).last_hidden_state
        for m in range(3):
            hidden = model.mtp(embed(sequence[:, m + 1 :]), hidden[:, : n - m - 1], module=m)
            engine_hidden = calls[m][2][: n - m - 1]
            torch.testing.assert_close(engine_hidden, hidden[0], atol=2e-5, rtol=1e-4, msg=f"module {m}")
    calls.clear()
    k = 4
    LLM(out, max_model_len=64, mtp_mode="eagle_with_att", mtp_step=k, parallel_drafting=True).generate(
        [prompt], SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True)
    )
    first = LLM(out, max_model_len=64).generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=1))
    window_ids, _, window_hidden, _ = calls[1]  # calls[0]: the prompt pass; calls[1]: the window
    assert window_ids[: k].tolist() == [first[0].token_ids[0]] + [-1] * (k - 1)
    with torch.no_grad():
        target = model.lm.model(input_ids=sequence).last_hidden_state
        context = model.mtp.fused_input(embed(torch.tensor([prompt[1:] + first[0].token_ids])), target)
        masked = model.mtp.masked_forward(context, k - 1)[0]
    torch.testing.assert_close(window_hidden[1:k], masked, atol=2e-5, rtol=1e-4)
