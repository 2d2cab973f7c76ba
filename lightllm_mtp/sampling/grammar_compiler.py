"""Grammar compilation off the engine's loop.

Compiling a request's grammar against the vocabulary takes tens of milliseconds for a large JSON schema (and the
tokenizer's table, built once, about a second on a 150k vocabulary): done in the engine's loop, it would stall the
steps of every running request. `compile` hands it to one background thread instead (xgrammar releases the GIL while
it compiles) and returns a future; the engine keeps the request waiting until it is done (engine/llm_engine.py).
Compiled grammars are cached by their text (kind and spec, and whether it starts after a marker: then it begins with
optional whitespace; least recently used out first), so a schema sent again is ready at once; a failed compilation is
not kept. The cache is used from the engine's thread only; the background thread only compiles.

The tokenizer's special tokens (its added tokens marked special: `<|im_start|>`, `<|endoftext|>`, the vision
tokens, ...) are special to xgrammar too, so no grammar allows them (inside a JSON string either, where their text
would fit); only the stop tokens end a complete grammar. xgrammar takes a token as special when its entry in the
vocabulary it is given is empty (TokenizerInfo.special_token_ids), so theirs are emptied there; the gate's table
keeps their text.

xgrammar's vocabulary is the tokenizer's ids only (`grammar_vocab_size`): a model's vocabulary padded past them
(Qwen3.5's 248320 rows) has ids without text that no grammar allows, and as xgrammar's special tokens they cost
every mask fill a pass over them (0.3-0.6 ms per fill for the tiny tokenizer padded to 248320). RequestGrammar
writes such ids' bits as 0 in the rows it fills.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from lightllm_mtp.sampling.grammar import Gate, RequestGrammar, import_xgrammar, grammar_text
from lightllm_mtp.sampling_params import StructuredOutput

CACHE_SIZE = 64  # compiled grammars kept


class GrammarCompiler:
    """One tokenizer's grammars. load_tokenizer: returns the HF tokenizer (called once, in the background);
    stop_token_ids: the tokens that end an answer once its grammar is complete (the engine's eos ids)."""

    def __init__(self, load_tokenizer: Callable[[], object], vocab_size: int,
                 stop_token_ids: Sequence[int] | None = None, threads: int = 2, cache_size: int = CACHE_SIZE):  # fmt: skip
        self.load_tokenizer = load_tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids) if stop_token_ids else None
        self.threads = threads
        self.cache_size = cache_size
        self.cache: OrderedDict[tuple[str, str, bool], Future] = OrderedDict()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        self._built = threading.Lock()
        self._compiler = None  # xgrammar's, made by the first compilation
        self._info = None  # its TokenizerInfo
        self._token_bytes: list | None = None  # token id -> its bytes (the reasoning gate's table)

    def compile(self, so: StructuredOutput) -> Future:
        """A future of the compiled grammar of `so` (done at once when the cache holds it); its exception is the
        ValueError of a grammar that does not compile."""
        key = (so.kind, so.spec, bool(so.starts_after))
        future = self.cache.get(key)
        if future is not None and not (future.done() and future.exception() is not None):
            self.cache.move_to_end(key)
            return future
        self.cache[key] = future = self.executor.submit(self._compile, so)
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return future

    def matcher(self, so: StructuredOutput, compiled=None) -> RequestGrammar:
        """A request's matcher over the compiled grammar (`compile(so)`'s result; None: compiled now, waiting)."""
        if compiled is None:
            compiled = self.compile(so).result()
        gate = Gate(so.starts_after.encode(), self._token_bytes) if so.starts_after else None
        return RequestGrammar(import_xgrammar().GrammarMatcher(compiled), self._info.vocab_size, gate)

    @property
    def info(self):
        """xgrammar's TokenizerInfo (built now if no compilation has run yet)."""
        self._xgr_compiler()
        return self._info

    def _compile(self, so: StructuredOutput):
        grammar = grammar_text(so)
        try:
            return self._xgr_compiler().compile_grammar(grammar)
        except RuntimeError as e:
            raise ValueError(f"{so.kind} does not compile: {str(e).splitlines()[-1][:300]}") from None

    def _xgr_compiler(self):
        with self._built:
            if self._compiler is None:
                xgr = import_xgrammar()
                tokenizer = self.load_tokenizer()
                vocab_size = grammar_vocab_size(tokenizer, self.vocab_size, self.stop_token_ids)
                info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                          stop_token_ids=self.stop_token_ids)  # fmt: skip
                self._token_bytes = info.decoded_vocab
                vocab = _vocab_without_special_tokens(tokenizer, vocab_size, set(info.stop_token_ids))
                self._info = xgr.TokenizerInfo.from_vocab_and_metadata(vocab, info.dump_metadata())
                self._compiler = xgr.GrammarCompiler(self._info, max_threads=self.threads, cache_enabled=False)
            return self._compiler


def grammar_vocab_size(tokenizer, vocab_size: int, stop_token_ids: Sequence[int] | None) -> int:
    """The ids xgrammar covers: up to the tokenizer's (and the stop tokens') highest, at most the model's vocab_size."""
    top = max(tokenizer.get_vocab().values(), default=-1)
    return min(vocab_size, max([top, *(stop_token_ids or [])]) + 1)


def _vocab_without_special_tokens(tokenizer, vocab_size: int, stop_token_ids: set[int]) -> list[str]:
    """The tokenizer's vocabulary as xgrammar reads it (token id -> its token string), the special added tokens
    other than the stop tokens emptied: xgrammar's mark of a special token."""
    special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special} - stop_token_ids
    vocab = [""] * vocab_size
    for token, i in tokenizer.get_vocab().items():
        if i < vocab_size and i not in special:
            vocab[i] = token
    return vocab
