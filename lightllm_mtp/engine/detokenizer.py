"""Incremental detokenization of one request's output, with stop strings: the server's front process and
`LLM.generate` (offline stop strings) both use it, so the two end a text at a stop string alike.

Each push decodes a short sliding window (vLLM's prefix / read offsets) rather than the whole output, so a
step costs O(window). Text is held back while it ends in an incomplete UTF-8 sequence or in a prefix of a stop
string; a stop string ends the text just before it (OpenAI semantics: the stop string is not returned), or just after
it with vLLM's include_stop_str_in_output. With min_tokens, a stop string counts only where it ends after the text of
the output's first min_tokens tokens (vLLM's rule: the text those tokens decoded to is not searched for an end).
"""

from __future__ import annotations

CONTEXT_TOKENS = 5  # prompt tokens decoded ahead of the output, so the first word's leading space is right


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int], stop: tuple[str, ...] = (), include_stop: bool = False,
                 min_tokens: int = 0):  # fmt: skip
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0  # ids[prefix_offset:read_offset] were decoded already (the window's context)
        self.read_offset = len(self.ids)
        self.stop = tuple(stop)
        self.include_stop = include_stop  # the text ends after the stop string, not before it
        self.text = ""  # the output text so far (cut at a stop string)
        self.sent = 0  # characters of `text` returned by push
        self.stopped = False  # a stop string was found: nothing more is decoded
        self.used = 0  # tokens of the last push that belong to the output (up to the one completing a stop string)
        self.min_tokens = min_tokens
        self.num_tokens = 0  # output tokens pushed
        self.protected = 0  # characters of `text` decoded from the first min_tokens tokens: no stop string ends there

    def push(self, token_ids: list[int], final: bool) -> str:
        """Adds a step's tokens; returns the text that can be released now (everything when final). With stop
        strings the tokens go in one at a time, so that `used` says which of them the output keeps: a step of
        several MTP tokens may complete a stop string before its last one."""
        self.used = 0
        if not self.stopped:
            pieces = [[t] for t in token_ids] if self.stop and token_ids else [token_ids]
            for i, piece in enumerate(pieces):
                self._add(piece, final and i == len(pieces) - 1)
                self.used += len(piece)
                if self.stopped:
                    break
        end = len(self.text) if final or self.stopped else len(self.text) - self._held_back()
        out = self.text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out

    def _add(self, ids: list[int], final: bool) -> None:
        self.ids += ids
        self.num_tokens += len(ids)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and (final or not full.endswith("\ufffd")):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            self._append(full[len(prefix) :])
        if self.num_tokens <= self.min_tokens:
            self.protected = len(self.text)

    def _append(self, new: str) -> None:
        longest = max((len(s) for s in self.stop), default=0)
        start = max(0, len(self.text) - longest + 1)  # a stop string may straddle the old text and the new
        self.text += new
        if self.num_tokens <= self.min_tokens:
            return
        found = ((self.text.find(s, max(start, self.protected - len(s) + 1)), s) for s in self.stop)
        hits = [(i, len(s)) for i, s in found if i >= 0]
        if hits:
            at, length = min(hits)
            self.text = self.text[: at + length * self.include_stop]
            self.stopped = True

    def _held_back(self) -> int:
        """Length of the longest tail of `text` that could begin a stop string. Only tails that start with a stop
        string's first character are compared (found by str.find), not every tail length."""
        held = 0
        for s in self.stop:
            window = self.text[max(0, len(self.text) - len(s) + 1) :]  # tails shorter than the stop string
            i = window.find(s[0])
            while i != -1 and len(window) - i > held:  # leftmost first: the longest tail
                if s.startswith(window[i:]):
                    held = len(window) - i
                    break
                i = window.find(s[0], i + 1)
        return held

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
