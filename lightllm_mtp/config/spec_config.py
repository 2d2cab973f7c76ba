"""Speculative-decoding settings. `mtp_mode` is a string only at the CLI/API boundary."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

MAX_MTP_STEP = 7


class MtpMode(Enum):
    # One MTP layer run `mtp_step` times autoregressively on its own outputs (one draft KV layer).
    EAGLE_WITH_ATT = "eagle_with_att"
    # A separate MTP layer per draft step (mtp.layers.{j} drafts token j+1; one draft KV layer each).
    VANILLA_WITH_ATT = "vanilla_with_att"

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
    draft_model_dir: str | None = None  # None: the mtp.* tensors of the main checkpoint
    # one draft forward proposes all k tokens from [x_{t+1}, MASK x (k-1)] (PTD; eagle_with_att only)
    parallel_drafting: bool = False
    # reduced draft vocabulary: the draft's logits cover only the first `draft_vocab_size` ids of the
    # frequency-ranked `draft_vocab_file` (tools/build_draft_vocab.py); None: the full vocabulary
    draft_vocab_file: str | None = None
    draft_vocab_size: int | None = None
    # each launch picks the drafts of the blocks it opens, 0..num_draft_tokens, from live acceptance and the
    # measured step cost (spec_decode/adaptive.py)
    adaptive: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.num_draft_tokens, int) or not 1 <= self.num_draft_tokens <= MAX_MTP_STEP:
            raise ValueError(f"mtp_step must be an int in [1, {MAX_MTP_STEP}], got {self.num_draft_tokens!r}")
        if self.draft_vocab_size is not None and self.draft_vocab_file is None:
            raise ValueError("mtp_draft_vocab_size needs mtp_draft_vocab_file (the frequency-ranked token ids)")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"mtp_draft_vocab_size must be >= 1, got {self.draft_vocab_size}")
        if self.parallel_drafting and self.mode is not MtpMode.EAGLE_WITH_ATT:
            raise ValueError(
                f"parallel_drafting needs mtp_mode {MtpMode.EAGLE_WITH_ATT.value} (one MTP module drafting every "
                f"position), got {self.mode.value}"
            )

    @property
    def num_draft_modules(self) -> int:
        return 1 if self.mode is MtpMode.EAGLE_WITH_ATT else self.num_draft_tokens

    @property
    def num_context_rows(self) -> int:
        """Committed rows before each verify block that every draft pass recomputes: multi-layer MTP refreshes
        module m's last m rows, whose next tokens were predictions when they were written."""
        return self.num_draft_modules - 1

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
    ) -> "SpecConfig | None":
        if mtp_mode is None:
            for name, value in (("mtp_draft_model_dir", draft_model_dir), ("parallel_drafting", parallel_drafting),
                                ("mtp_draft_vocab_file", draft_vocab_file), ("mtp_draft_vocab_size", draft_vocab_size),
                                ("mtp_adaptive", adaptive)):
                if value:
                    raise ValueError(f"{name} is set but mtp_mode is not")
            return None
        return cls(MtpMode.parse(mtp_mode), mtp_step, draft_model_dir, parallel_drafting, draft_vocab_file,
                   draft_vocab_size, adaptive)
