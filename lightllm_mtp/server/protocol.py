"""Request schemas (OpenAI completions / chat; LightLLM's /generate in generate_protocol.py) and the OpenAI error body.

Bodies are parsed here, not by FastAPI, so that every bad input (invalid JSON, a wrong type, an out-of-range
value, an unsupported feature) becomes one `ApiError`: HTTP 4xx with
`{"error": {"message", "type", "param", "code"}}`. Every field of the OpenAI schemas and the common vLLM / SGLang
extensions is in request_fields.py's catalogue: honored (declared here, strictly typed: "16" is not a number, true is
not a token id or a count, "yes" is not a boolean), refused with a 400 naming it, or informational; fields the
catalogue does not know are ignored with a logged warning.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictInt, ValidationError, field_validator, model_validator

from lightllm_mtp.sampling_params import (
    MAX_CACHE_SALT_CHARS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOP_LOGPROBS,
    SamplingParams,
    StructuredOutput,
    check_stop_strings,
)
from lightllm_mtp.server.request_fields import COMPLETIONS, UnsupportedField, check_fields
from lightllm_mtp.server.structured_fields import structured_output

STRICT = ConfigDict(extra="ignore", strict=True)
MAX_CHOICES = 16  # n

# Every collection stops at its first bad item: an 8 MiB body of 1.6M `true`s as token ids otherwise builds an error
# per item and union member (a minute of CPU in the front), and a million bad messages several seconds.
FIRST_ERROR = Field(fail_fast=True)
TokenIds = Annotated[list[StrictInt], FIRST_ERROR]
Strings = Annotated[list[str], FIRST_ERROR]
Objects = Annotated[list[dict], FIRST_ERROR]
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # the only way a surrogate gets into valid UTF-8 JSON


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], raw: bytes) -> M:
    try:
        data = json.loads(raw.decode("utf-8"))  # strict: json.loads(bytes) would let UTF-8-encoded surrogates through
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    except ValueError as e:  # valid JSON that Python refuses to convert: an integer of more than 4,300 digits
        raise ApiError(400, f"the request body holds a value this server cannot read: {e}",
                       code="invalid_json") from None  # fmt: skip
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    if _SURROGATE_ESCAPE.search(raw):  # else no string in it can hold one: no walk over a million token ids
        _reject_lone_surrogates(data)
    try:
        return model.model_validate(data)
    except UnsupportedField as e:
        raise ApiError(400, str(e), param=e.key, code="unsupported_field") from None
    except ValidationError as e:
        errors = e.errors()
        param = str(errors[0]["loc"][0]) if errors[0]["loc"] else None  # the top-level field
        same = [err for err in errors if err["loc"][:1] == errors[0]["loc"][:1]][:3]  # union members fail each
        msg = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg'].removeprefix('Value error, ')}" for err in same)
        raise ApiError(400, msg, param=param, code="invalid_value") from None


def _reject_lone_surrogates(data) -> None:
    """JSON escapes such as "\\ud800" decode to strings that are not valid Unicode, which no tokenizer takes."""
    pending = [data]
    while pending:  # iterative: the body may be nested as deep as the JSON parser allows
        item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ApiError(400, "the request holds a string that is not valid Unicode (a lone surrogate)",
                               code="invalid_value") from None  # fmt: skip
        elif isinstance(item, dict):
            pending += item.keys()
            pending += item.values()
        elif isinstance(item, list):
            pending += item


def check_stop(v: str | list[str] | None) -> str | list[str] | None:
    check_stop_strings(v)  # the offline API's rule (sampling_params.py)
    return v


def check_cache_salt(v: str | None) -> str | None:
    if v is not None and not 1 <= len(v) <= MAX_CACHE_SALT_CHARS:
        raise ValueError(f"must be a non-empty string of at most {MAX_CACHE_SALT_CHARS} characters")
    return v


def check_seed(v: int | None) -> int | None:
    if v is not None and not -(2**63) <= v < 2**63:
        raise ValueError("must fit in 64 bits")
    return v


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's extension: usage (so far) in every chunk


class SamplingRequest(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI names; vLLM-style extensions)."""

    model_config = STRICT
    ENDPOINT: ClassVar[str]  # the request_fields catalogue's endpoint

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # extension: -1 or 0 disables
    n: int = 1  # choices: n engine requests (seed s: choice i samples with seed s + i)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # extension (vLLM)
    min_p: float = 0.0  # extension (vLLM)
    min_tokens: int = 0  # extension (vLLM)
    logit_bias: dict[str, float] | None = None  # {"token id": bias in [-100, 100]}
    include_stop_str_in_output: bool = False  # extension (vLLM)
    seed: int | None = None
    stop: str | Strings | None = None
    stop_token_ids: TokenIds | None = None  # extension
    ignore_eos: bool = False  # extension
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_mtp_stats: bool = False  # extension: the request's MTP acceptance in usage["mtp"]
    # extension (vLLM's name): each choice carries the generated `token_ids` (per chunk when streaming), the first
    # response also `prompt_token_ids`: a client can resend a conversation without re-tokenizing the answers
    return_token_ids: bool = False
    # extension (vLLM's name): the prefix cache is shared only between requests of the same salt (multi-tenant use)
    cache_salt: str | None = None
    # structured outputs (server/structured_fields.py reads them into one StructuredOutput)
    response_format: dict | None = None
    guided_json: dict | str | None = None  # vLLM
    guided_regex: str | None = None
    guided_choice: Strings | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    structured_outputs: dict | None = None
    json_schema: dict | str | None = None  # SGLang
    regex: str | None = None
    ebnf: str | None = None
    _structured: StructuredOutput | None = PrivateAttr(None)
    STRUCTURED_FIELDS: ClassVar[tuple[str, ...]] = (
        "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
        "structured_outputs", "json_schema", "regex", "ebnf", "text",
    )  # fmt: skip

    @model_validator(mode="before")
    @classmethod
    def _catalogue(cls, data):
        """Refused fields are a 400 (UnsupportedField), informational ones dropped, unknown ones logged."""
        if isinstance(data, dict):
            data = dict(data)
            check_fields(cls.ENDPOINT, data)
        return data

    @model_validator(mode="after")
    def _structured_output(self):
        fields = {k: getattr(self, k) for k in self.STRUCTURED_FIELDS if k in type(self).model_fields}
        self._structured = structured_output(fields)
        return self

    @property
    def structured(self) -> StructuredOutput | None:
        return self._structured

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens(cls, v):
        if v is not None and v < 1:
            raise ValueError(f"must be at least 1, got {v}")
        return v

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, v):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"must be a finite number >= 0, got {v}")
        return v

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, v):
        if not 0.0 < v <= 1.0:
            raise ValueError(f"must be in (0, 1], got {v}")
        return v

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v):
        if v < -1:
            raise ValueError(f"must be -1, 0 (disabled) or positive, got {v}")
        return v

    @field_validator("n")
    @classmethod
    def _n(cls, v):
        if not 1 <= v <= MAX_CHOICES:
            raise ValueError(f"must be in [1, {MAX_CHOICES}], got {v}")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _penalty(cls, v):
        if not -2.0 <= v <= 2.0:
            raise ValueError(f"must be in [-2, 2], got {v}")
        return v

    @field_validator("repetition_penalty")
    @classmethod
    def _repetition_penalty(cls, v):
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"must be a finite number > 0, got {v}")
        return v

    @field_validator("min_p")
    @classmethod
    def _min_p(cls, v):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"must be in [0, 1], got {v}")
        return v

    @field_validator("min_tokens")
    @classmethod
    def _min_tokens(cls, v):
        if v < 0:
            raise ValueError(f"must be >= 0, got {v}")
        return v

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _logit_bias(cls, v):
        if isinstance(v, dict):
            for key, bias in v.items():  # the first bad item stops the check (no error per item)
                if not key.isdigit() or len(key) > 9:
                    raise ValueError(f"keys must be token ids (decimal strings), got {key[:16]!r}")
                if not isinstance(bias, (int, float)) or isinstance(bias, bool) or not -100 <= bias <= 100:
                    raise ValueError(f"values must be numbers in [-100, 100], got {bias!r} for {key}")
            v = {key: float(bias) for key, bias in v.items()}
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        return check_stop(v)

    @field_validator("seed")
    @classmethod
    def _seed(cls, v):
        return check_seed(v)

    @field_validator("cache_salt")
    @classmethod
    def _cache_salt(cls, v):
        return check_cache_salt(v)

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_token_ids(cls, v):
        if v is not None and len(v) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"at most {MAX_STOP_TOKEN_IDS} stop token ids, got {len(v)}")
        if v is not None and any(t < 0 for t in v):
            raise ValueError("token ids must be >= 0")
        return v

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats

    @property
    def num_logprobs(self) -> int | None:
        """Top alternatives per token when the request asks for logprobs (None: it does not)."""
        return None

    def sampling_params(self, max_new_tokens: int, choice: int = 0) -> SamplingParams:
        """The engine request of choice `choice` (of n): a seeded request's choices sample from seeds s, s + 1, .."""
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=max_new_tokens,
            seed=None if self.seed is None else (self.seed + choice + 2**63) % 2**64 - 2**63,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            cache_salt=self.cache_salt,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            min_p=self.min_p,
            min_tokens=self.min_tokens,
            logit_bias={int(k): b for k, b in (self.logit_bias or {}).items()},
            logprobs=self.num_logprobs,
            include_stop_str_in_output=self.include_stop_str_in_output,
            structured=self._structured,
        )


class CompletionRequest(SamplingRequest):
    ENDPOINT = COMPLETIONS
    prompt: str | TokenIds | Strings | Annotated[list[TokenIds], FIRST_ERROR]  # strict: true is not a token id
    logprobs: int | None = None  # the chosen token's logprob and this many top alternatives (0: none)
    best_of: int | None = None  # only n (no server-side candidate ranking)

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v):
        if v is not None and not 0 <= v <= MAX_TOP_LOGPROBS:
            raise ValueError(f"must be in [0, {MAX_TOP_LOGPROBS}], got {v}")
        return v

    @model_validator(mode="after")
    def _best_of(self):
        if self.best_of is not None and self.best_of != self.n:
            raise UnsupportedField("best_of", None, f"best_of {self.best_of} != n {self.n}: candidates are not "
                                   "ranked by this server; ask for n choices")  # fmt: skip
        return self

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError(f"batched prompts are not supported (got {len(v)}): send one request per prompt")
            v = v[0]
        if not v:
            raise ValueError("the prompt is empty")
        return v
