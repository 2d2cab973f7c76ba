"""The requests whose structured output's grammar is compiling in the background (sampling/grammar_compiler.py).

Such a request waits in the scheduler's queue (WAITING; the scheduler passes it over) until its grammar is compiled:
`collect` then gives it its matcher, and it is scheduled like any other. One whose grammar does not compile is handed
back with its `error` set, for the engine to finish. The compiler is made with the first such request; it loads the
model's tokenizer in its own thread.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable

from lightllm_mtp.engine.request import Request
from lightllm_mtp.sampling.grammar_compiler import GrammarCompiler


class PendingGrammars:
    def __init__(self, model_dir: str, vocab_size: int, eos_token_ids: Iterable[int]):
        self.model_dir = model_dir
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)  # an answer whose grammar is complete ends with one of them
        self.compiler: GrammarCompiler | None = None
        self.waiting: list[Request] = []

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def start(self, req: Request) -> None:
        """Starts compiling req's grammar (at once ready when the cache holds it)."""
        if self.compiler is None:
            self.compiler = model_grammar_compiler(self.model_dir, self.vocab_size, self.eos_token_ids)
        req.compiling = self.compiler.compile(req.params.structured)
        self.waiting.append(req)

    def collect(self, wait_s: float = 0.0) -> list[Request]:
        """Gives each request whose grammar compiled its matcher (it may be scheduled now); returns those whose
        grammar did not compile, their `error` set. wait_s: first wait up to this long for one to be done."""
        self.waiting = [r for r in self.waiting if not r.ended]  # aborted meanwhile
        if wait_s and self.waiting:
            futures = [r.compiling for r in self.waiting]
            concurrent.futures.wait(futures, timeout=wait_s, return_when=concurrent.futures.FIRST_COMPLETED)
        failed = []
        for req in [r for r in self.waiting if r.compiling.done()]:
            self.waiting.remove(req)
            compiling, req.compiling = req.compiling, None
            try:
                req.grammar = self.compiler.matcher(req.params.structured, compiling.result())
            except Exception as e:  # noqa: BLE001 - any failure ends this request only, with its reason
                req.error = f"the structured output's grammar did not compile: {e}"
                failed.append(req)
        return failed


def model_grammar_compiler(model_dir: str, vocab_size: int, eos_token_ids: Iterable[int]) -> GrammarCompiler:
    """The grammar compiler of a model's tokenizer (loaded by the first compilation, in the compiler's thread); every
    rank that chooses tokens makes the same one, so their matchers give the same masks."""
    from transformers import AutoTokenizer

    def load():
        return AutoTokenizer.from_pretrained(model_dir)

    return GrammarCompiler(load, vocab_size, sorted(eos_token_ids))
