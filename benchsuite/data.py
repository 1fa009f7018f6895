"""Token sources for training and evaluation: synthetic ids, a built-in text corpus, memmapped .bin files.

`train.data` selects one:

- ``"synthetic"``: uniform random ids in [0, model.vocab). Measures throughput only; the loss means nothing.
- ``"builtin"``: an English corpus assembled offline from text that ships with Python (the help
  topics in ``pydoc_data.topics`` plus docstrings of `BUILTIN_MODULES`), byte-level tokenized.
  Identical across runs and machines with the same Python minor version; needs model.vocab >= 257.
- a path: a flat token file in nanoGPT layout, uint16 unless the name ends in ``.u32.bin``
  (uint32). Relative paths resolve against ``base_dir`` (or the working directory).

Text sources cut the token stream into disjoint chunks of seq_len + 1 tokens; a seeded permutation
holds out `VAL_FRACTION` of them (at least `MIN_VAL_CHUNKS`) for validation, and training draws
only from the rest. Global sample i of training is chunk ``order(epoch)[i % n_train]`` with
``epoch = i // n_train``, so every data-parallel rank computes its own rows with no communication,
and the rows of all ranks for one step are exactly the global batch of a single process.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import importlib
import inspect
import os
import sys
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from benchsuite.atomic import atomic_file

EOS = 256  # document separator; ids 0..255 are raw UTF-8 bytes
BYTE_VOCAB = 257  # bytes + EOS: the byte-level tokenizer's vocab size
VAL_FRACTION = 0.05
MIN_VAL_CHUNKS = 4
SYNTHETIC_VAL_ROWS = 64  # synthetic data has no held-out text; a fixed random set keeps eval code uniform

BUILTIN_NAME = f"python{sys.version_info.major}.{sys.version_info.minor} pydoc_data.topics + stdlib docstrings"
# Pure-Python modules whose public definitions do not depend on the platform or optional
# extensions (no ssl-only classes, no OS-specific functions), so the corpus is the same everywhere.
BUILTIN_MODULES = (
    "argparse", "ast", "calendar", "cmd", "collections", "configparser", "contextlib", "csv",
    "dataclasses", "difflib", "dis", "email.message", "enum", "fractions", "functools", "gettext",
    "heapq", "inspect", "ipaddress", "json", "logging", "mailbox", "optparse", "pickletools",
    "pprint", "queue", "random", "shlex", "statistics", "string", "tarfile", "textwrap",
    "threading", "tokenize", "traceback", "unittest.case", "urllib.parse", "zipfile",
)

_DATA_HELP = ("give 'synthetic', 'builtin', or the path of a token file ending in .bin (uint16) "
              "or .u32.bin (uint32); `benchsuite tokenize TEXT... -o FILE.bin` writes one from text files")


# ---------------------------------------------------------------- byte-level tokenizer

def encode(text: str) -> np.ndarray:
    """UTF-8 bytes of text as uint16 ids (no EOS appended)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


def decode(ids: Iterable[int]) -> str:
    """Text of byte ids; each EOS becomes the marker '<eos>' and invalid UTF-8 is replaced."""
    parts, current = [], bytearray()
    for i in ids:
        i = int(i)
        if i == EOS:
            parts.append(current.decode("utf-8", errors="replace"))
            current = bytearray()
        elif 0 <= i < 256:
            current.append(i)
        else:
            raise ValueError(f"id {i} is outside the byte-level vocab [0, {BYTE_VOCAB})")
    parts.append(current.decode("utf-8", errors="replace"))
    return "<eos>".join(parts)


# ---------------------------------------------------------------- built-in corpus

def _clean(doc) -> str | None:
    """Dedented text with '\\n' line endings, or None for a missing/empty docstring."""
    if not isinstance(doc, str) or not doc.strip():
        return None
    return inspect.cleandoc(doc.replace("\r\n", "\n").replace("\r", "\n"))


def _module_docs(name: str) -> list[str]:
    """Module docstring, then public classes/functions defined in it (sorted), each followed by its methods."""
    mod = importlib.import_module(name)
    objects = [mod]
    for attr, obj in sorted(vars(mod).items()):
        if attr.startswith("_") or getattr(obj, "__module__", None) != name:
            continue
        if inspect.isfunction(obj):
            objects.append(obj)
        elif inspect.isclass(obj):
            objects.append(obj)
            for member_name, member in sorted(vars(obj).items()):
                member = getattr(member, "__func__", member)  # classmethod / staticmethod
                # the standard library's own: another package may add methods to a stdlib class (transformers
                # adds logging.Logger.warning_once), which would change the corpus with what was imported before
                where = getattr(getattr(member, "fget", member), "__module__", None) or ""
                stdlib = where.partition(".")[0] in sys.stdlib_module_names
                if not member_name.startswith("_") and stdlib and (
                        inspect.isfunction(member) or isinstance(member, property)):
                    objects.append(member)
    return [d for d in (_clean(o.__doc__) for o in objects) if d is not None]


def builtin_documents() -> list[str]:
    """The built-in corpus as documents: help topics sorted by key, then docstrings of BUILTIN_MODULES."""
    if sys.flags.optimize >= 2:
        raise RuntimeError("train.data = 'builtin' needs docstrings, which python -OO strips; "
                           "run without -OO or use another train.data")
    from pydoc_data.topics import topics

    docs = [_clean(topics[key]) for key in sorted(topics)]
    for name in BUILTIN_MODULES:
        docs += _module_docs(name)
    return [d for d in docs if d is not None]


@functools.lru_cache(maxsize=1)
def builtin_tokens() -> np.ndarray:
    """Read-only uint16 token stream of the built-in corpus: each document's bytes, then EOS."""
    parts = []
    for doc in builtin_documents():
        parts += [encode(doc), np.array([EOS], dtype=np.uint16)]
    tokens = np.concatenate(parts).astype("<u2")
    tokens.setflags(write=False)
    return tokens


# ---------------------------------------------------------------- .bin files

def bin_dtype(path: str | Path) -> np.dtype:
    """The file's token dtype by name: '*.u32.bin' is little-endian uint32, other '*.bin' uint16."""
    return np.dtype("<u4") if Path(path).name.endswith(".u32.bin") else np.dtype("<u2")


def write_bin(path: str | Path, tokens, dtype=None) -> Path:
    """Write tokens as a flat .bin file; dtype defaults to the one the name implies and must match it."""
    path = Path(path)
    if path.suffix != ".bin":
        raise ValueError(f"{path}: token files must end in .bin (uint16) or .u32.bin (uint32)")
    expected = bin_dtype(path)
    if dtype is not None and np.dtype(dtype).newbyteorder("<") != expected:
        raise ValueError(f"{path}: dtype {np.dtype(dtype)} does not match the name, which implies "
                         f"{expected.name}; name uint32 files '*.u32.bin' and uint16 files '*.bin'")
    arr = np.asarray(tokens)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{path}: tokens must be integers, got {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(expected).max):
        raise ValueError(f"{path}: token ids must lie in [0, {np.iinfo(expected).max}] for {expected.name}; "
                         f"got [{arr.min()}, {arr.max()}]")
    with atomic_file(path) as f:
        f.write(arr.astype(expected, order="C"))  # not tofile: numpy's own write loses the errno of a full disk
    return path


def _not_text(path: Path, out: Path) -> str | None:
    """Why tokenize leaves out the input `path` (it is the output `out`, or another token file), else None."""
    if os.path.exists(out) and os.path.samefile(path, out):
        return f"it is the output file -o {out}"
    if path.suffix == ".bin":
        return "a token file, not text"
    return None


def tokenize_files(paths: Iterable[str | Path], out: str | Path, chunk_bytes: int = 1 << 24) -> dict:
    """Byte-level tokens of UTF-8 text files, one document per file, each followed by EOS, as a .bin.

    Streams in chunks (files larger than memory are fine) and writes atomically: a file that is
    missing, unreadable or not UTF-8 raises ValueError naming it and the byte offset, and no .bin is left.
    A token file among the inputs (the output itself, as in `tokenize data/* -o data/train.bin` run a
    second time, or another .bin) is skipped with a warning naming it: tokens are never read as text.
    """
    out = Path(out)
    if out.suffix != ".bin" or out.name.endswith(".u32.bin"):
        raise ValueError(f"{out}: byte-level tokens are uint16; name the output '*.bin' (not '*.u32.bin')")
    paths = [Path(p) for p in paths]
    for p in paths:
        if not p.is_file():
            raise ValueError(f"{p}: no such text file")
        if not os.access(p, os.R_OK):
            raise ValueError(f"{p}: cannot read (permission denied)")
    skipped = {p: why for p in paths if (why := _not_text(p, out))}
    for p, why in skipped.items():
        warnings.warn(f"{p}: skipped, {why}")
    paths = [p for p in paths if p not in skipped]
    if not paths:
        raise ValueError(f"{out}: no text file to tokenize, every input is a token file; give text files")
    h, tokens = hashlib.sha256(), 0
    eos = np.array([EOS], dtype="<u2").tobytes()
    with atomic_file(out) as f:
        for p in paths:
            utf8, offset = codecs.getincrementaldecoder("utf-8")(), 0
            with open(p, "rb") as src:
                while chunk := src.read(chunk_bytes):
                    try:
                        utf8.decode(chunk)
                    except UnicodeDecodeError as e:
                        raise ValueError(f"{p}: not UTF-8 text (invalid byte at offset {offset + e.start}); "
                                         f"give text files, or tokenize with your own tokenizer and write "
                                         f"the ids with benchsuite.data.write_bin") from None
                    offset += len(chunk)
                    ids = np.frombuffer(chunk, dtype=np.uint8).astype("<u2").tobytes()
                    f.write(ids)
                    h.update(ids)
            try:
                utf8.decode(b"", final=True)
            except UnicodeDecodeError:
                raise ValueError(f"{p}: not UTF-8 text (truncated character at the end)") from None
            f.write(eos)
            h.update(eos)
            tokens += offset + 1
    return {"path": str(out), "files": len(paths), "tokens": tokens, "bytes": 2 * tokens,
            "vocab_needed": BYTE_VOCAB, "sha256": h.hexdigest()}


def _resolve(data: str, base_dir) -> Path:
    path = Path(data).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    return path


def check_data_spec(data: str, base_dir=None) -> str | None:
    """A problem with train.data (for validation before launch), or None when it can be loaded."""
    if not isinstance(data, str) or not data:
        return f"train.data: expected a non-empty string, got {data!r}; {_DATA_HELP}"
    if data in ("synthetic", "builtin"):
        return None
    path = _resolve(data, base_dir)
    where = f"train.data: {data!r} (resolved to {path.resolve()})"
    if not path.exists():
        return f"{where} does not exist; {_DATA_HELP}"
    if not path.is_file():
        return f"{where} is not a file; {_DATA_HELP}"
    if path.suffix != ".bin":
        return f"{where} is not a .bin token file; {_DATA_HELP}"
    itemsize = bin_dtype(path).itemsize
    size = path.stat().st_size
    if size == 0 or size % itemsize:
        return (f"{where} has {size} bytes, not a positive multiple of {itemsize} "
                f"({bin_dtype(path).name}); rewrite it with benchsuite.data.write_bin")
    return None


def _max_token(tokens: np.ndarray) -> int:
    """Largest id, scanned in chunks so a multi-GB memmap never loads at once."""
    step = 1 << 26
    return max(int(tokens[i:i + step].max()) for i in range(0, len(tokens), step))


@functools.lru_cache(maxsize=64)
def _file_max_token(path: str, size: int, mtime_ns: int) -> int:
    """_max_token of a token file, scanned once per version of the file (size and mtime in the key): a
    suite's validation checks every run's data before launch, and a sweep's runs share one file."""
    return _max_token(np.memmap(path, dtype=bin_dtype(Path(path)), mode="r"))


# ---------------------------------------------------------------- sources

def _check_batch_args(step: int, dp_rank: int, dp_size: int, micro_batch: int) -> None:
    if step < 0 or micro_batch < 1 or dp_size < 1 or not 0 <= dp_rank < dp_size:
        raise ValueError(f"batch needs step >= 0, micro_batch >= 1 and 0 <= dp_rank < dp_size; got "
                         f"step={step}, micro_batch={micro_batch}, dp_rank={dp_rank}, dp_size={dp_size}")


def _split(rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of seq_len + 1 ids -> (inputs, targets) long tensors shifted by one."""
    rows = torch.from_numpy(rows.astype(np.int64))
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


class SyntheticSource:
    """Uniform random ids; global row r of step s is seeded by (seed, s, r), so shards match the global batch."""

    kind = "synthetic"

    def __init__(self, vocab: int, seq_len: int, seed: int):
        self.vocab_size, self.seq_len, self.seed = vocab, seq_len, seed

    def _rows(self, stream: int, step: int, rows: range) -> np.ndarray:
        return np.stack([np.random.default_rng([self.seed, stream, step, r]).integers(
            0, self.vocab_size, self.seq_len + 1) for r in rows])

    def batch(self, step: int, dp_rank: int = 0, dp_size: int = 1,
              micro_batch: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (inputs [B, T], targets [B, T]) of global step `step` (count micro-steps with grad_accum)."""
        _check_batch_args(step, dp_rank, dp_size, micro_batch)
        start = dp_rank * micro_batch
        return _split(self._rows(0, step, range(start, start + micro_batch)))

    def val_batches(self, micro_batch: int, max_batches: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """SYNTHETIC_VAL_ROWS fixed random rows in batches of micro_batch (last may be short); same on every rank."""
        starts = range(0, SYNTHETIC_VAL_ROWS, micro_batch)
        for start in starts[:max_batches]:
            yield _split(self._rows(1, 0, range(start, min(start + micro_batch, SYNTHETIC_VAL_ROWS))))

    def describe(self) -> dict:
        return {"kind": self.kind, "corpus": None, "tokens": None, "train_tokens": None, "val_tokens": None,
                "sha256": None, "vocab_size": self.vocab_size, "seq_len": self.seq_len, "seed": self.seed}


class TokenSource:
    """A token stream (built-in corpus or memmapped .bin) split into disjoint train/val chunks by seed."""

    def __init__(self, tokens: np.ndarray, vocab_size: int, seq_len: int, seed: int,
                 kind: str, corpus: str, data: str):
        self.tokens, self.vocab_size, self.seq_len, self.seed = tokens, vocab_size, seq_len, seed
        self.kind, self.corpus = kind, corpus
        self.chunk_len = seq_len + 1
        n_chunks = len(tokens) // self.chunk_len
        n_val = max(MIN_VAL_CHUNKS, round(n_chunks * VAL_FRACTION))
        if n_chunks < n_val + 1:
            raise ValueError(f"train.data: {data!r} has {len(tokens)} tokens, too few for model.seq_len = {seq_len}: "
                             f"need at least {(MIN_VAL_CHUNKS + 1) * self.chunk_len} tokens "
                             f"({MIN_VAL_CHUNKS} validation chunks + 1 training chunk of seq_len + 1); "
                             f"use a larger file or a smaller model.seq_len")
        perm = np.random.default_rng([seed, 0]).permutation(n_chunks)
        self.val_chunks = np.sort(perm[:n_val])
        self.train_chunks = np.sort(perm[n_val:])
        self._orders: dict[int, np.ndarray] = {}
        self._sha256: str | None = None

    def _order(self, epoch: int) -> np.ndarray:
        """Training chunks in the shuffled order of one epoch; the last two epochs are kept."""
        if epoch not in self._orders:
            rng = np.random.default_rng([self.seed, 1, epoch])
            self._orders = {e: o for e, o in self._orders.items() if e == epoch - 1}
            self._orders[epoch] = self.train_chunks[rng.permutation(len(self.train_chunks))]
        return self._orders[epoch]

    def _rows(self, chunks) -> np.ndarray:
        return np.stack([self.tokens[c * self.chunk_len:(c + 1) * self.chunk_len] for c in chunks])

    def batch(self, step: int, dp_rank: int = 0, dp_size: int = 1,
              micro_batch: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (inputs [B, T], targets [B, T]) of global step `step` (count micro-steps with grad_accum)."""
        _check_batch_args(step, dp_rank, dp_size, micro_batch)
        n_train = len(self.train_chunks)
        first = step * micro_batch * dp_size + dp_rank * micro_batch
        chunks = [self._order(i // n_train)[i % n_train] for i in range(first, first + micro_batch)]
        return _split(self._rows(chunks))

    def val_batches(self, micro_batch: int, max_batches: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Validation chunks in index order, micro_batch rows each (last may be short); same on every rank."""
        starts = range(0, len(self.val_chunks), micro_batch)
        for start in starts[:max_batches]:
            yield _split(self._rows(self.val_chunks[start:start + micro_batch]))

    def sha256(self) -> str:
        """Hash of the token stream as stored (uint16 little-endian for builtin; the file bytes for .bin)."""
        if self._sha256 is None:
            h = hashlib.sha256()
            step = 1 << 26
            for i in range(0, len(self.tokens), step):
                h.update(np.ascontiguousarray(self.tokens[i:i + step]).tobytes())
            self._sha256 = h.hexdigest()
        return self._sha256

    def describe(self) -> dict:
        """Facts for the run record; hashing reads the whole stream once (seconds for GB files)."""
        return {"kind": self.kind, "corpus": self.corpus, "tokens": len(self.tokens),
                "train_tokens": len(self.train_chunks) * self.chunk_len,
                "val_tokens": len(self.val_chunks) * self.chunk_len,
                "sha256": self.sha256(), "vocab_size": self.vocab_size, "seq_len": self.seq_len, "seed": self.seed}


def make_source(data: str, vocab: int, seq_len: int, seed: int, base_dir=None) -> SyntheticSource | TokenSource:
    """The source train.data names, checked against model.vocab and model.seq_len."""
    problem = check_data_spec(data, base_dir)
    if problem:
        raise ValueError(problem)
    if seq_len < 1:
        raise ValueError(f"model.seq_len must be >= 1, got {seq_len}")
    if data == "synthetic":
        return SyntheticSource(vocab, seq_len, seed)
    if data == "builtin":
        tokens, vocab_size, why = builtin_tokens(), BYTE_VOCAB, "256 bytes + <eos>"
        kind, corpus = "builtin", BUILTIN_NAME
    else:
        path = _resolve(data, base_dir).resolve()
        tokens = np.memmap(path, dtype=bin_dtype(path), mode="r")
        stat = path.stat()
        vocab_size = _file_max_token(str(path), stat.st_size, stat.st_mtime_ns) + 1
        why = f"its largest token id is {vocab_size - 1}"
        kind, corpus = "bin", str(path)
    if vocab < vocab_size:
        raise ValueError(f"train.data = {data!r} needs model.vocab >= {vocab_size} ({why}), "
                         f"but model.vocab = {vocab}; set model.vocab to at least {vocab_size}")
    return TokenSource(tokens, vocab_size, seq_len, seed, kind, corpus, data)
