"""The same weights through HF transformers (`Qwen3_5ForCausalLM` / `Qwen3_5MoeForCausalLM`), for a peer timing.

The HF model is built on the meta device and takes our tensors by reference (`load_state_dict(assign=True)`):
our TensorSpec names are checkpoint names, so only the prefix changes (`model.language_model.` of the
multimodal layout -> `model.` of the text CausalLM). No second copy of the weights is made.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from lightllm_mtp.config.model_config import ModelConfig


def hf_text_config(hf_config: dict) -> dict:
    """The flat text-config fields of a config.json (multimodal wrapper or flat text config)."""
    text = hf_config.get("text_config") if isinstance(hf_config.get("text_config"), dict) else hf_config
    drop = ("architectures", "model_type", "auto_map", "transformers_version")
    return {k: v for k, v in text.items() if k not in drop}


def hf_state_dict(cfg: ModelConfig, weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our checkpoint-named tensors under the CausalLM's names (same tensor objects)."""
    out = {}
    for name, t in weights.items():
        if name.startswith(cfg.weight_prefix):
            name = "model." + name[len(cfg.weight_prefix) :]
        out[name] = t
    if cfg.tie_word_embeddings:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def build_hf_model(hf_config: dict, cfg: ModelConfig, weights: Mapping[str, torch.Tensor], device: torch.device):
    import transformers

    cls = transformers.Qwen3_5MoeForCausalLM if cfg.is_moe else transformers.Qwen3_5ForCausalLM
    dtype = weights[f"{cfg.weight_prefix}embed_tokens.weight"].dtype
    config = cls.config_class(**hf_text_config(hf_config))
    config.tie_word_embeddings = cfg.tie_word_embeddings
    config.dtype = dtype
    with torch.device("meta"):
        model = cls(config)
    result = model.load_state_dict(hf_state_dict(cfg, weights), strict=False, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise RuntimeError(
            f"HF {cls.__name__} does not take our weights: missing {result.missing_keys[:8]}, "
            f"unexpected {result.unexpected_keys[:8]}"
        )
    _materialize_buffers(model, device)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"HF model still has meta tensors after loading: {left[:8]}")
    model.generation_config.eos_token_id = None  # generate() would fill eos from here otherwise
    return model.eval()


def _materialize_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Non-persistent buffers (rotary inv_freq) stay on meta: rebuild the modules that own them on `device`."""
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if any(b.is_meta for b in child.buffers(recurse=False)):
                with torch.device(device):
                    fresh = type(child)(config=child.config)
                setattr(parent, child_name, fresh)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def _generate(model, prompts: torch.Tensor, new_tokens: int) -> tuple[float, torch.Tensor]:
    import transformers

    gen = transformers.GenerationConfig(
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=0,
        use_cache=True,
    )
    _sync(prompts.device)
    start = time.perf_counter()
    out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), generation_config=gen)
    _sync(prompts.device)
    elapsed = time.perf_counter() - start
    if out.shape[1] != prompts.shape[1] + new_tokens:
        raise RuntimeError(f"HF generate returned {out.shape[1] - prompts.shape[1]} of {new_tokens} new tokens")
    return elapsed, out[:, prompts.shape[1] :]


def time_hf_generate(model, prompts: torch.Tensor, output_len: int, repeats: int = 1) -> dict:
    """Greedy generate of `output_len` tokens after `prompts` [bs, L] (device tensor).

    e2e: one generate(output_len); prefill: generate(1); decode per step: (e2e - prefill) / (output_len - 1).
    Each is the median of `repeats` runs after one warm-up generate(2)."""
    bs = prompts.shape[0]
    _generate(model, prompts, min(2, output_len))  # warm-up: kernels, allocator, cache classes
    e2e_runs, first_runs, tokens = [], [], None
    for _ in range(repeats):
        t, tokens = _generate(model, prompts, output_len)
        e2e_runs.append(t)
        first_runs.append(_generate(model, prompts, 1)[0])
    e2e, first = _median(e2e_runs), _median(first_runs)
    res = {
        "batch_size": bs,
        "e2e_ms": e2e * 1e3,
        "e2e_output_tokens_per_s": bs * output_len / e2e,
        "prefill_plus_first_token_ms": first * 1e3,
    }
    if output_len > 1:
        step = max(e2e - first, 0.0) / (output_len - 1)
        res["decode_step_ms"] = step * 1e3
        res["decode_tokens_per_s"] = bs / step if step > 0 else None
    res["tokens"] = tokens.tolist()
    return res


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
