"""Structured outputs on xgrammar: a request's grammar as a token matcher that gives each row the tokens it allows.

Why xgrammar: it is the default grammar engine of vLLM, SGLang and TensorRT-LLM, has CPU wheels for Python 3.11 /
3.12 on the package index (llguidance's newest wheels did not resolve there; outlines-core has no EBNF), compiles
JSON schema, regex and EBNF, and its matcher rolls back: exactly what speculative decoding needs. Compilation runs in
the background (grammar_compiler.py).

With `starts_after` (the end of a reasoning block) the output is free until that text has appeared (found in the
tokens' bytes, so a marker split over several tokens or landing inside a verify block is found where it ends); the
grammar applies from the next token, row by row inside a verify block too, and starts with up to
MAX_LEADING_WHITESPACE whitespace characters (Qwen's template writes `</think>\n\n` before the answer: a grammar
without them would force the model off its distribution; bounded, so that whitespace cannot run on).

Under speculative decoding the matcher only ever holds the committed output: a verify block's row masks come from
accepting the block's drafts one by one (row i: the state after d_1..d_i; the rows past the first illegal draft
allow everything, as that draft is rejected at its row) and rolling them back. A block's drafts are chosen on the
host at the launch that verifies it, from each position's best candidates (sampling/draft_choice.py): the first one
legal after the committed output and the drafts before it, so no launch waits for the device. The engine advances
the matcher with the tokens it appends, and nothing else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch

from lightllm_mtp.sampling.logits_processing import RowMasks
from lightllm_mtp.sampling_params import StructuredOutput


def import_xgrammar():
    try:
        import xgrammar
    except ImportError as e:  # the `structured` extra
        raise ValueError("structured outputs need xgrammar: pip install 'lightllm_mtp[structured]'") from e
    return xgrammar


MAX_LEADING_WHITESPACE = 8  # characters, JSON's whitespace, before a grammar that starts after a marker
GATED_LEADING_WHITESPACE = " \t\r\n"  # the characters of that leading part


def grammar_text(so: StructuredOutput):
    """The xgrammar Grammar of a structured output (syntax checked, no tokenizer needed); ValueError if invalid."""
    grammar = _grammar_of(so)
    if not so.starts_after:
        return grammar
    xgr = import_xgrammar()
    chars = "".join({"\t": "\\t", "\r": "\\r", "\n": "\\n"}.get(c, c) for c in GATED_LEADING_WHITESPACE)
    leading = xgr.Grammar.from_ebnf(f"root ::= [{chars}]{{0,{MAX_LEADING_WHITESPACE}}}")
    return xgr.Grammar.concat(leading, grammar)


def _grammar_of(so: StructuredOutput):
    xgr = import_xgrammar()
    try:
        if so.kind == "json_schema":
            return xgr.Grammar.from_json_schema(so.spec, any_whitespace=False, strict_mode=True)
        if so.kind == "json_object":  # OpenAI's json_object: an object, any properties
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
        if so.kind == "regex":
            return xgr.Grammar.from_regex(so.spec)
        if so.kind == "choice":
            choices = json.loads(so.spec)
            if not choices or not all(isinstance(c, str) and c for c in choices):
                raise ValueError("choice needs a non-empty list of non-empty strings")
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(json.dumps(c) for c in choices))
        return xgr.Grammar.from_ebnf(so.spec)
    except (RuntimeError, ValueError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"invalid {so.kind}: {str(e).splitlines()[-1][:300]}") from None


@dataclass
class Gate:
    """Whether the output has reached the text after which the grammar applies (found in the tokens' bytes)."""

    marker: bytes
    token_bytes: list  # token id -> its bytes (xgrammar's decoded vocabulary)
    tail: bytes = b""  # the output's last bytes, fewer than the marker's
    open: bool = False

    def after(self, tokens: list[int]) -> list[bool]:
        """Whether the grammar applies to the token after each prefix of `tokens` (the state is not changed)."""
        tail, is_open, out = self.tail, self.open, []
        for t in tokens:
            if not is_open:
                tail += self.token_bytes[t] if t < len(self.token_bytes) else b""
                is_open = self.marker in tail
                tail = tail[-(len(self.marker) - 1) :] if len(self.marker) > 1 else b""
            out.append(is_open)
        return out

    def advance(self, token: int) -> bool:
        """A committed token; True when it belongs to the grammar (the marker ended before it)."""
        if self.open:
            return True
        self.open = self.after([token])[0]
        tail = self.tail + (self.token_bytes[token] if token < len(self.token_bytes) else b"")
        self.tail = tail[-(len(self.marker) - 1) :] if len(self.marker) > 1 else b""
        return False


@dataclass
class RequestGrammar:
    matcher: object  # xgrammar.GrammarMatcher over the committed output
    vocab_size: int  # the ids xgrammar covers (the tokenizer's); a wider row's ids past them are never allowed
    gate: Gate | None = None  # StructuredOutput.starts_after

    def __post_init__(self):
        self._scratch = torch.empty((1, (self.vocab_size + 31) // 32), dtype=torch.int32)  # one row xgrammar fills
        self._words = self._scratch.numpy()[0].view(np.uint32)
        self._tail = np.uint32((1 << (self.vocab_size % 32 or 32)) - 1)  # the last word's bits of ids in the vocab

    def advance(self, token: int) -> None:
        """A committed output token (the engine's append)."""
        if self.gate is not None and not self.gate.advance(token):
            return
        if not self.matcher.is_terminated() and not self.matcher.accept_token(token):
            raise RuntimeError(f"token {token} was committed against its grammar")

    def _walk(self, tokens: list[int], fill, first_row: int | None) -> tuple[int, bool]:
        """Accepts `tokens` into the matcher (past the gate); fill(row, applies) after each when first_row is set.
        Returns (tokens the matcher took, whether all were legal)."""
        opened = self.gate.after(tokens) if self.gate is not None else [True] * len(tokens)
        applies = self.gate is None or self.gate.open
        m, taken = self.matcher, 0
        for i, t in enumerate(tokens):
            if applies:  # t belongs to the grammar
                if m.is_terminated() or not m.accept_token(t):
                    return taken, False
                taken += 1
            applies = opened[i]
            if first_row is not None:
                fill(first_row + i + 1, applies)
        return taken, True

    def fill_after(self, tokens: list[int], bitmask: torch.Tensor, row: int) -> bool:
        """bitmask[row] = the tokens allowed after the committed output + `tokens`; False (row left allowing all)
        when `tokens` themselves break the grammar."""
        taken, ok = self._walk(tokens, None, None)
        applies = self.gate is None or (self.gate.after(tokens)[-1] if tokens else self.gate.open)
        if ok and applies:
            self._fill(bitmask, row)
        if taken:
            self.matcher.rollback(taken)
        return ok

    def fill_block(self, drafts: list[int], bitmask: torch.Tensor, row0: int) -> None:
        """Rows row0..row0 + len(drafts) of a verify block: row i after d_1..d_i; rows past the first illegal draft
        keep allowing all (that draft is rejected at its own row), as do rows still before the gate's marker."""
        if self.gate is None or self.gate.open:
            self._fill(bitmask, row0)

        def fill(row: int, applies: bool) -> None:
            if applies:
                self._fill(bitmask, row)

        taken, _ = self._walk(drafts, fill, row0)
        if taken:
            self.matcher.rollback(taken)

    def choose_drafts(self, candidates: list[list[int]]) -> list[int]:
        """A block's drafts from each position's candidate ids (the proposer's best, best first; -1: none): at every
        position the best candidate the grammar allows after the committed output and the drafts chosen before it,
        else the one token it allows there if it allows only one; stops where neither exists. Before the gate's
        marker: the best candidate. The allowed token of highest draft logit is taken whenever it is among the
        candidates or is the only one allowed: what masking the draft logits would have chosen."""
        chosen, taken = [], 0
        for ids in candidates:
            ids = [t for t in ids if 0 <= t < self.vocab_size]
            applies = self.gate is None or (self.gate.after(chosen)[-1] if chosen else self.gate.open)
            if not applies:
                pick = ids[0] if ids else None
            elif self.matcher.is_terminated():  # past the grammar's end: its stop tokens only, as _fill allows
                stops = self.matcher.stop_token_ids
                pick = next((t for t in ids if t in stops), stops[0] if len(stops) == 1 else None)
            else:
                pick = self._accept_best(ids)
                taken += pick is not None
            if pick is None:
                break
            chosen.append(pick)
        if taken:
            self.matcher.rollback(taken)
        return chosen

    def _accept_best(self, ids: list[int]) -> int | None:
        """The first of `ids` the matcher allows next, else the only token it allows; accepted into it."""
        if ids and self.matcher.accept_token(ids[0]):  # the common case: the draft's own first choice is legal
            return ids[0]
        words = self._fill_scratch()
        if ids:
            cand = np.asarray(ids, dtype=np.int64)
            legal = (words[cand // 32] >> (cand % 32).astype(np.uint32)) & 1
            if legal.any():
                token = ids[int(legal.argmax())]
                return token if self.matcher.accept_token(token) else None
        nonzero = np.flatnonzero(words)
        if len(nonzero) != 1 or words[nonzero[0]] & (words[nonzero[0]] - np.uint32(1)):
            return None  # several tokens allowed (or none)
        token = int(nonzero[0]) * 32 + int(words[nonzero[0]]).bit_length() - 1
        return token if token < self.vocab_size and self.matcher.accept_token(token) else None

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self.matcher.is_terminated():  # past the grammar's end (eos accepted): nothing but eos
            bitmask[row] = 0
            for t in self.matcher.stop_token_ids:
                bit = 1 << (t % 32)
                bitmask[row, t // 32] |= bit - (1 << 32) * (bit >= 1 << 31)  # as an int32
        else:  # the grammar's ids; a wider row's ids past them (ids without text) are never allowed
            width = self._scratch.shape[1]
            bitmask[row, :width] = torch.from_numpy(self._fill_scratch().view(np.int32))
            bitmask[row, width:] = 0

    def _fill_scratch(self) -> np.ndarray:
        """The tokens allowed next as uint32 words; bits past vocab_size clear (xgrammar leaves them set)."""
        self.matcher.fill_next_token_bitmask(self._scratch, 0)
        self._words[-1] &= self._tail
        return self._words


def new_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """[rows, ceil(V / 32)] int32, every token allowed."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def row_masks(bitmask: torch.Tensor, vocab_size: int, device: torch.device) -> RowMasks:
    """The bitmask as RowMasks ([N, V] bool) on the device (bits unpacked there: each byte's 8 through a table; the
    int32 words are little-endian, so byte j holds tokens 8j..8j+7, lowest bit first)."""
    rows = bitmask.shape[0]
    data = bitmask.to(device, non_blocking=True).view(torch.uint8).flatten()
    allowed = _byte_bits(device).index_select(0, data.int()).view(rows, -1)[:, :vocab_size]
    return RowMasks(allowed)


_BYTE_BITS: dict[torch.device, torch.Tensor] = {}


def _byte_bits(device: torch.device) -> torch.Tensor:
    """[256, 8] bool: the bits of each byte value, lowest first."""
    table = _BYTE_BITS.get(device)
    if table is None:
        table = ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).bool().to(device)
        _BYTE_BITS[device] = table
    return table
