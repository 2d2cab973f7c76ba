"""Speculative-decoding settings. `mtp_mode` is a string only at the CLI/API boundary."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from lightllm_mtp.config.forced_acceptance import ForcedAcceptance

MAX_MTP_STEP = 7


class MtpMode(Enum):
    # One MTP layer run `mtp_step` times autoregressively on its own outputs (one draft KV layer).
    EAGLE_WITH_ATT = "eagle_with_att"
    # A separate MTP layer per draft step (mtp.layers.{j} drafts token j+1; one draft KV layer each).
    VANILLA_WITH_ATT = "vanilla_with_att"
    # A separate, smaller checkpoint (Qwen3.5 dense or MoE) of the same vocabulary drafts from tokens alone
    # (`draft_model_dir`); with parallel_drafting it is a PARD model: one forward from [x_{t+1}, MASK x (k-1)].
    DRAFT_MODEL = "draft_model"

    @classmethod
    def parse(cls, value: "str | MtpMode") -> "MtpMode":
        if isinstance(value, MtpMode):
            return value
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown mtp_mode {value!r}; choose one of: {allowed}") from None


@dataclass(frozen=True)
class SpecConfig:
    mode: MtpMode
    num_draft_tokens: int  # k, draft tokens per verify step (the CLI's mtp_step), 1..MAX_MTP_STEP
    # MTP modes: where mtp.* live (None: the main checkpoint); draft_model: the draft checkpoint
    draft_model_dir: str | None = None
    # one draft forward proposes all k tokens from [x_{t+1}, MASK x (k-1)] (PTD with eagle_with_att, PARD with
    # draft_model)
    parallel_drafting: bool = False
    # reduced draft vocabulary: the draft's logits cover only the first `draft_vocab_size` ids of the
    # frequency-ranked `draft_vocab_file` (tools/build_draft_vocab.py); None: the full vocabulary
    draft_vocab_file: str | None = None
    draft_vocab_size: int | None = None
    # each launch picks the drafts of the blocks it opens, 0..num_draft_tokens, from live acceptance and the
    # measured step cost (spec_decode/adaptive.py)
    adaptive: bool = False
    # PARD's mask token id (None: the draft config's `pard_token` / `mask_token_id`)
    mask_token_id: int | None = None
    # benchmarking only: drafts accepted by a weighted coin, not checked (config/forced_acceptance.py)
    force_acceptance: ForcedAcceptance | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.num_draft_tokens, int) or not 1 <= self.num_draft_tokens <= MAX_MTP_STEP:
            raise ValueError(f"mtp_step must be an int in [1, {MAX_MTP_STEP}], got {self.num_draft_tokens!r}")
        if self.draft_vocab_size is not None and self.draft_vocab_file is None:
            raise ValueError("mtp_draft_vocab_size needs mtp_draft_vocab_file (the frequency-ranked token ids)")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"mtp_draft_vocab_size must be >= 1, got {self.draft_vocab_size}")
        if self.parallel_drafting and self.mode is MtpMode.VANILLA_WITH_ATT:
            raise ValueError(
                f"parallel_drafting needs mtp_mode {MtpMode.EAGLE_WITH_ATT.value} (one MTP module drafting every "
                f"position) or {MtpMode.DRAFT_MODEL.value} (PARD), got {self.mode.value}"
            )
        if self.mode is MtpMode.DRAFT_MODEL and not self.draft_model_dir:
            raise ValueError("mtp_mode draft_model needs mtp_draft_model_dir (the draft checkpoint's directory)")
        if self.mask_token_id is not None and not (self.parallel_drafting and self.mode is MtpMode.DRAFT_MODEL):
            raise ValueError("mtp_mask_token_id is PARD's mask token: it needs mtp_mode draft_model with "
                             "parallel_drafting")
        if self.mask_token_id is not None and self.mask_token_id < 0:
            raise ValueError(f"mtp_mask_token_id must be >= 0, got {self.mask_token_id}")
        if self.adaptive and self.mode is MtpMode.DRAFT_MODEL:
            raise ValueError("mtp_adaptive is not supported with mtp_mode draft_model yet (MTP modes only)")
        forced = self.force_acceptance
        if forced is not None and len(forced.rates) != self.num_draft_tokens:
            raise ValueError(f"force_acceptance has {len(forced.rates)} rates for mtp_step {self.num_draft_tokens}")

    @property
    def num_draft_modules(self) -> int:
        """MTP modules (each a KV layer of the target's pool); a draft model has its own pool."""
        if self.mode is MtpMode.DRAFT_MODEL:
            return 0
        return 1 if self.mode is MtpMode.EAGLE_WITH_ATT else self.num_draft_tokens

    @property
    def num_context_rows(self) -> int:
        """Committed rows before each verify block that every draft pass recomputes: multi-layer MTP refreshes
        module m's last m rows, whose next tokens were predictions when they were written."""
        return max(self.num_draft_modules - 1, 0)

    @classmethod
    def from_args(
        cls,
        mtp_mode: "MtpMode | str | None",
        mtp_step: int,
        draft_model_dir: str | None,
        parallel_drafting: bool = False,
        draft_vocab_file: str | None = None,
        draft_vocab_size: int | None = None,
        adaptive: bool = False,
        mask_token_id: int | None = None,
        force_acceptance: str | None = None,
    ) -> "SpecConfig | None":
        """force_acceptance: the mtp_force_acceptance text, parsed against mtp_step (config/forced_acceptance.py)."""
        if mtp_mode is None:
            for name, value in (("mtp_draft_model_dir", draft_model_dir), ("parallel_drafting", parallel_drafting),
                                ("mtp_draft_vocab_file", draft_vocab_file), ("mtp_draft_vocab_size", draft_vocab_size),
                                ("mtp_adaptive", adaptive), ("mtp_mask_token_id", mask_token_id is not None),
                                ("mtp_force_acceptance", force_acceptance is not None)):  # fmt: skip
                if value:
                    raise ValueError(f"{name} is set but mtp_mode is not")
            return None
        spec = cls(MtpMode.parse(mtp_mode), mtp_step, draft_model_dir, parallel_drafting, draft_vocab_file,
                   draft_vocab_size, adaptive=adaptive, mask_token_id=mask_token_id)
        if force_acceptance is None:
            return spec
        return replace(spec, force_acceptance=ForcedAcceptance.parse(force_acceptance, spec.num_draft_tokens))
