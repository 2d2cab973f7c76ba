"""The recipe shared by the random and the trained tiny checkpoints: architectures, tiny sizes, the HF config, and
the byte-level BPE tokenizer trained on the Python standard library."""

from __future__ import annotations

from pathlib import Path

from lightllm_mtp.tools.tiny_corpus import read_stdlib

ARCHS = ("qwen3_5", "qwen3_5_moe")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOKENIZER_VOCAB = 2000  # BPE merges + byte alphabet; the special tokens come after
CORPUS_CHARS = 1_500_000
INIT_STD = 0.1  # HF initializer_range: a gain of about 1 per projection, so the stack is not chaotic
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(out_dir: Path, texts: list[str] | None = None, vocab_size: int = TOKENIZER_VOCAB):
    """Train a byte-level BPE on `texts` (default: the first ~1.5 MB of the standard library's top-level modules),
    save it with a ChatML template; returns the transformers tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX

    # Same pipeline as HF's Qwen3_5Tokenizer (which AutoTokenizer picks for this model type).
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, initial_alphabet=alphabet, show_progress=False
    )
    if texts is None:
        texts = [f.text for f in read_stdlib("*.py", max_chars=CORPUS_CHARS)]
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    eos = SPECIAL_TOKENS[0]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=eos, eos_token=eos, pad_token=eos, chat_template=CHAT_TEMPLATE,
        additional_special_tokens=list(SPECIAL_TOKENS[1:]), model_max_length=4096,
    )  # fmt: skip
    fast.save_pretrained(out_dir)
    return fast


# Text-model sizes of the random tiny checkpoint (6 GDN + 2 full-attention layers); make_config takes others.
TINY_SIZES = dict(
    hidden_size=64, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    intermediate_size=128, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
)  # fmt: skip
# A smaller draft for a tiny target (same tokenizer, so the same vocabulary): 3 GDN + 1 full-attention layers.
DRAFT_SIZES = dict(
    TINY_SIZES, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
    linear_num_key_heads=1, linear_num_value_heads=2, intermediate_size=64, num_experts=4, moe_intermediate_size=16,
    shared_expert_intermediate_size=24,
)  # fmt: skip
_MOE_ONLY = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")


def mrope_section(head_dim: int, partial_rotary_factor: float = 0.25) -> list[int]:
    """Split the rotary frequencies over the (t, h, w) sections like the real [11, 11, 10] of 32."""
    n = int(head_dim * partial_rotary_factor) // 2
    w = n // 3
    h = (n - w) // 2
    return [n - h - w, h, w]


def make_config(arch: str, vocab_size: int, eos_id: int, mtp_layers: int, tie_word_embeddings: bool, sizes=None):
    """The HF multimodal-wrapper config of a tiny model. `sizes` (default TINY_SIZES) holds at least the fields of
    TINY_SIZES (the MoE ones used only for qwen3_5_moe, intermediate_size only for the dense model) and may
    override any other text-config field."""
    from transformers import Qwen3_5Config, Qwen3_5MoeConfig

    moe = arch == "qwen3_5_moe"
    sizes = dict(TINY_SIZES if sizes is None else sizes)
    for key in _MOE_ONLY if not moe else ("intermediate_size",):
        sizes.pop(key, None)
    ids = dict(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    mrope = dict(mrope_section=mrope_section(sizes["head_dim"]), mrope_interleaved=True)
    text = dict(
        vocab_size=vocab_size,
        full_attention_interval=4,
        rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25, **mrope),
        attn_output_gate=True,
        linear_conv_kernel_dim=4,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        initializer_range=INIT_STD,
        tie_word_embeddings=tie_word_embeddings,
        mtp_num_hidden_layers=mtp_layers,
        mtp_use_dedicated_embeddings=False,
        mamba_ssm_dtype="float32",
        **ids,
    )
    text.update(sizes)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4, num_position_embeddings=16)
    vision["out_hidden_size"] = text["hidden_size"]
    cls = Qwen3_5MoeConfig if moe else Qwen3_5Config
    cfg = cls(text_config=text, vision_config=vision, tie_word_embeddings=tie_word_embeddings)
    for key, value in ids.items():
        setattr(cfg, key, value)
    return cfg
