from __future__ import annotations

import math
from dataclasses import dataclass, field

MIN_TEMPERATURE = 0.01  # positive temperatures below this are raised to it
MAX_STOP_TOKEN_IDS = 1024  # checked per generated token: a set, and a bounded one
MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_STOP_STRING_CHARS = 1024  # output text is matched against every stop string at each step
DEFAULT_MAX_TOKENS = 16  # as OpenAI's and vLLM's


def check_stop_strings(stop: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """`stop` as a tuple: one string or a list of them, each non-empty (the server's and the offline API's rule)."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
    if not all(isinstance(s, str) for s in stops):
        raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
    if any(not s for s in stops):
        raise ValueError("stop strings must be non-empty")
    if any(len(s) > MAX_STOP_STRING_CHARS for s in stops):
        raise ValueError(f"stop strings are at most {MAX_STOP_STRING_CHARS} characters long")
    return stops
MAX_CACHE_SALT_CHARS = 1024
STRUCTURED_KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutput:
    """A grammar the output must follow (sampling/grammar.py compiles it with xgrammar): `json_schema` (spec: the
    schema as JSON text), `json_object` (any JSON object; spec ""), `regex`, `choice` (spec: a JSON list of the
    allowed strings) or `grammar` (EBNF, xgrammar's GBNF dialect)."""

    kind: str
    spec: str = ""
    # the grammar applies from the token after the output first holds this text (a reasoning parser's end of
    # thinking, "</think>"); "": from the first token
    starts_after: str = ""

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURED_KINDS:
            raise ValueError(f"structured output kind must be one of {STRUCTURED_KINDS}, got {self.kind!r}")
        if not isinstance(self.spec, str):
            raise ValueError(f"structured output spec must be a string, got {type(self.spec).__name__}")
MAX_LOGIT_BIAS = 100.0  # OpenAI's range: [-100, 100]
MAX_TOP_LOGPROBS = 20  # OpenAI's limit


def _check_logit_bias(bias) -> tuple[tuple[int, float], ...]:
    """{token id: bias} or (id, bias) pairs -> sorted pairs; ids non-negative ints, biases finite in [-100, 100]."""
    pairs = sorted((bias.items() if isinstance(bias, dict) else bias) or ())
    for t, b in pairs:
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise ValueError(f"logit_bias keys must be non-negative token ids, got {t!r}")
        if not isinstance(b, (int, float)) or isinstance(b, bool) or not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {b!r} for token {t}")
    return tuple((t, float(b)) for t, b in pairs)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding controls (vLLM/LightLLM semantics). temperature 0 means greedy. `max_tokens` (vLLM's,
    OpenAI's name) and `max_new_tokens` (LightLLM's) are one setting: give either."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0): no top-k filter
    max_new_tokens: int | None = None  # None: max_tokens, else DEFAULT_MAX_TOKENS
    seed: int | None = None
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)  # any iterable of ints is accepted
    ignore_eos: bool = False
    # stop strings: the output ends just before the first one (not included), as the server's `stop`; a str or list
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None  # the same setting as max_new_tokens
    # the prefix cache: requests share cached prefixes only with requests of the same salt (None: the unsalted
    # partition), so a tenant's salt keeps its prompts unreachable (and unprobeable via cached_tokens) for others
    cache_salt: str | None = None
    # logits processing (sampling/logits_processing.py), vLLM's semantics
    presence_penalty: float = 0.0  # [-2, 2]
    frequency_penalty: float = 0.0  # [-2, 2]
    repetition_penalty: float = 1.0  # > 0; 1: off
    min_p: float = 0.0  # [0, 1]: tokens below min_p x the top token's probability are dropped (sampling only)
    min_tokens: int = 0  # until the output has this many tokens: eos and stop_token_ids masked, stop strings not ending
    logit_bias: tuple[tuple[int, float], ...] = ()  # {token id: bias} or (id, bias) pairs
    # the generated tokens' logprobs (the target's log-softmax of its raw logits at each emitted position) and this
    # many top alternatives each; None: none
    logprobs: int | None = None
    include_stop_str_in_output: bool = False  # the matched stop string stays in the text
    structured: StructuredOutput | None = None  # the output follows this grammar (masked at every token choice)

    def __post_init__(self) -> None:
        if self.max_new_tokens is not None and self.max_tokens is not None and self.max_new_tokens != self.max_tokens:
            raise ValueError(f"max_tokens {self.max_tokens} and max_new_tokens {self.max_new_tokens} differ: give one")
        limit = next((v for v in (self.max_new_tokens, self.max_tokens) if v is not None), DEFAULT_MAX_TOKENS)
        object.__setattr__(self, "max_new_tokens", limit)
        object.__setattr__(self, "max_tokens", limit)
        object.__setattr__(self, "stop", check_stop_strings(self.stop))
        t = self.temperature
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if 0 < t < MIN_TEMPERATURE:  # logits / t would overflow float32 (vLLM clamps the same way)
            object.__setattr__(self, "temperature", MIN_TEMPERATURE)
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (disabled) or a positive int, got {self.top_k!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        if self.seed is not None and (
            not isinstance(self.seed, int) or isinstance(self.seed, bool) or not -(2**63) <= self.seed < 2**63
        ):
            raise ValueError(f"seed must be an int that fits in 64 bits (or None), got {self.seed!r}")
        stops = list(self.stop_token_ids)
        if len(stops) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids, got {len(stops)}")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in stops):
            raise ValueError(f"stop_token_ids must be non-negative ints, got {stops[:8]!r}")
        object.__setattr__(self, "stop_token_ids", frozenset(stops))  # membership per token: a set
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not -2.0 <= v <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {v!r}")
        rp = self.repetition_penalty
        if not isinstance(rp, (int, float)) or not math.isfinite(rp) or rp <= 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {rp!r}")
        if not isinstance(self.min_p, (int, float)) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not isinstance(self.min_tokens, int) or isinstance(self.min_tokens, bool) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be a non-negative int, got {self.min_tokens!r}")
        if self.min_tokens > self.max_new_tokens:
            raise ValueError(f"min_tokens {self.min_tokens} exceeds max_tokens {self.max_new_tokens}")
        object.__setattr__(self, "logit_bias", _check_logit_bias(self.logit_bias))
        lp = self.logprobs
        if lp is not None and (not isinstance(lp, int) or isinstance(lp, bool) or not 0 <= lp <= MAX_TOP_LOGPROBS):
            raise ValueError(f"logprobs must be an int in [0, {MAX_TOP_LOGPROBS}] (or None), got {lp!r}")
        if self.structured is not None:
            if not isinstance(self.structured, StructuredOutput):
                raise ValueError(f"structured must be a StructuredOutput, got {type(self.structured).__name__}")
            if self.ignore_eos:
                raise ValueError("ignore_eos cannot be combined with a structured output (a grammar ends at eos)")
        salt = self.cache_salt
        if salt is not None and (not isinstance(salt, str) or not 1 <= len(salt) <= MAX_CACHE_SALT_CHARS):
            raise ValueError(f"cache_salt must be a non-empty string of at most {MAX_CACHE_SALT_CHARS} characters "
                             f"(or None), got {salt if not isinstance(salt, str) else salt[:32]!r}")  # fmt: skip

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_logits_processing(self) -> bool:
        """Whether its logits go through sampling/logits_processing.py (penalties, bias, min_tokens)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.min_tokens or self.logit_bias)  # fmt: skip

    @property
    def reads_history(self) -> bool:
        """Whether choosing its next token needs its committed output on the host: such a request is left out of a
        step launched while one of its steps is in flight (overlap scheduling)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.min_tokens or self.structured is not None)  # fmt: skip
