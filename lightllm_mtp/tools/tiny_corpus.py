"""The offline text corpus of the tiny checkpoints: the running interpreter's standard library sources.

Present on every machine with no download. Files are read in sorted relative-path order; a file is held out when
crc32(relative path) % HELDOUT_EVERY == 0, so the split of a file does not depend on which other files this
interpreter version ships (a checkpoint trained under Python 3.12 can be evaluated under 3.11 on held-out text).
`pydoc_data/topics.py` carries the language reference's prose, so docs are in too.
"""

from __future__ import annotations

import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

HELDOUT_EVERY = 20
# site-packages: not the standard library; encodings: machine-generated charmap tables that would dominate
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "encodings", "__pycache__"})


@dataclass(frozen=True)
class CorpusFile:
    path: str  # relative to the stdlib root, '/'-separated
    text: str


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def read_stdlib(pattern: str = "**/*.py", max_chars: int | None = None) -> list[CorpusFile]:
    """Files matching `pattern` in sorted order; stops after the file that reaches `max_chars` in total."""
    root = stdlib_root()
    paths = [p for p in root.glob(pattern) if p.is_file() and not EXCLUDED_DIRS & set(p.relative_to(root).parts)]
    files, total = [], 0
    for path in sorted(paths, key=lambda p: p.relative_to(root).as_posix()):
        text = path.read_text(encoding="utf-8", errors="replace")
        files.append(CorpusFile(path.relative_to(root).as_posix(), text))
        total += len(text)
        if max_chars is not None and total >= max_chars:
            break
    return files


def is_heldout(path: str) -> bool:
    return zlib.crc32(path.encode()) % HELDOUT_EVERY == 0


@dataclass(frozen=True)
class CorpusSplit:
    train: list[CorpusFile]
    heldout: list[CorpusFile]

    @property
    def num_chars(self) -> tuple[int, int]:
        return sum(len(f.text) for f in self.train), sum(len(f.text) for f in self.heldout)


def split_corpus(max_train_chars: int | None = None, max_heldout_chars: int | None = None) -> CorpusSplit:
    """The whole standard library split by file; each side capped separately (tests use small caps)."""
    train, heldout, sizes = [], [], [0, 0]
    for f in read_stdlib():
        side, cap = (1, max_heldout_chars) if is_heldout(f.path) else (0, max_train_chars)
        if cap is not None and sizes[side] >= cap:
            continue
        (heldout if side else train).append(f)
        sizes[side] += len(f.text)
    if not train or not heldout:
        found = f"{len(train)} train / {len(heldout)} held-out files"
        raise RuntimeError(f"the standard library at {stdlib_root()} gave {found}")
    return CorpusSplit(train, heldout)


def token_stream(tokenizer, files: list[CorpusFile], eos_id: int) -> torch.Tensor:
    """All files tokenized and concatenated, each followed by eos: int64 [N]."""
    docs = tokenizer.backend_tokenizer.encode_batch([f.text for f in files], add_special_tokens=False)
    return torch.tensor([t for doc in docs for t in (*doc.ids, eos_id)], dtype=torch.int64)


def heldout_prompts(tokenizer, files: list[CorpusFile], num: int, prompt_tokens: int,
                    per_file: int = 1) -> list[tuple[str, list[int]]]:  # fmt: skip
    """(path, token ids) prompts from held-out files in order: `prompt_tokens` tokens starting at the first line
    break past a third of the file (mid-file code, not the license header); with per_file = n, n prompts a file,
    past k / (n + 2) of it for k = 1..n (a smaller standard library, as the GPU machine's Python 3.12 build with 23
    usable held-out files, then still gives `num`). Files too short are skipped."""
    prompts = []
    for f in files:
        for part in range(per_file):
            start = f.text.find("\n", len(f.text) * (part + 1) // (per_file + 2)) + 1
            if start <= 0:
                continue
            ids = tokenizer.encode(f.text[start : start + 16 * prompt_tokens], add_special_tokens=False)
            if len(ids) > prompt_tokens:
                prompts.append((f.path, ids[:prompt_tokens]))
            if len(prompts) == num:
                return prompts
    raise RuntimeError(f"the held-out files give only {len(prompts)} prompts of {prompt_tokens} tokens ({per_file} a "
                       f"file), {num} asked")
