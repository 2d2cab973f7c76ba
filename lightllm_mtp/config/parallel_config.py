"""Tensor / pipeline parallel layout: `tp` ranks split every layer, `pp` stages split the layer stack.

Global rank = stage * tp + tp_rank; rank 0 (stage 0, tp rank 0) is the driver that schedules. Checked against the
model once, at start, so that a bad combination fails with one message before any process starts."""

from __future__ import annotations

from dataclasses import dataclass

from lightllm_mtp.config.model_config import ModelConfig


@dataclass(frozen=True)
class ParallelConfig:
    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    def check_model(self, cfg: ModelConfig) -> None:
        """Raises one ValueError naming every size this layout cannot split."""
        problems = []
        for name, heads in (("num_key_value_heads", cfg.num_key_value_heads),
                            ("linear_num_key_heads", cfg.linear_num_key_heads)):  # fmt: skip
            if heads % self.tp and self.tp % heads:  # fewer heads than ranks: each is replicated on tp / heads
                problems.append(f"{name}={heads} neither divides nor is divisible by tp={self.tp}")
        splits = {
            "num_attention_heads": cfg.num_attention_heads,
            "linear_num_value_heads": cfg.linear_num_value_heads,
        }
        if cfg.moe is not None:
            splits["moe_intermediate_size"] = cfg.moe.moe_intermediate_size
            splits["shared_expert_intermediate_size"] = cfg.moe.shared_expert_intermediate_size
        else:
            splits["intermediate_size"] = cfg.intermediate_size
        for name, value in splits.items():
            if value % self.tp:
                problems.append(f"{name}={value} is not divisible by tp={self.tp}")
        if self.pp > cfg.num_hidden_layers:
            problems.append(f"pp={self.pp} stages for {cfg.num_hidden_layers} layers (at most one stage per layer)")
        if problems:
            raise ValueError(f"tp={self.tp} x pp={self.pp} does not fit this model: " + "; ".join(problems))

    def local_heads(self, heads: int) -> int:
        """Heads of a kind one tp rank holds (one, replicated, when there are fewer heads than ranks)."""
        return max(1, heads // self.tp)

    def stage_layers(self, num_layers: int, stage: int) -> range:
        """The decoder layers of one pipeline stage: contiguous, sizes differing by at most one (earlier stages
        take the extra layers)."""
        base, extra = divmod(num_layers, self.pp)
        start = stage * base + min(stage, extra)
        return range(start, start + base + (1 if stage < extra else 0))


@dataclass(frozen=True)
class RankInfo:
    """Where one process sits in the layout."""

    parallel: ParallelConfig
    rank: int = 0

    @property
    def tp_rank(self) -> int:
        return self.rank % self.parallel.tp

    @property
    def stage(self) -> int:
        return self.rank // self.parallel.tp

    @property
    def is_first_stage(self) -> bool:
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.parallel.pp - 1
