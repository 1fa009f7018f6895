"""Token sources: reproducible corpus, .bin round trips, leak-free split, exact dp sharding, clear errors."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from benchsuite import data
from benchsuite.data import (BYTE_VOCAB, EOS, builtin_documents, builtin_tokens, check_data_spec, decode,
                             encode, make_source, write_bin)

ROOT = Path(__file__).resolve().parents[1]


def test_tokenizer_round_trip():
    text = "héllo, wörld\r\n"
    ids = encode(text)
    assert ids.dtype == np.uint16 and ids.max() < 256
    assert decode(ids) == text
    assert decode([*encode("a"), EOS, *encode("b")]) == "a<eos>b"
    with pytest.raises(ValueError, match="outside the byte-level vocab"):
        decode([BYTE_VOCAB])


def test_builtin_corpus_identical_across_builds():
    docs = builtin_documents()
    assert docs == builtin_documents()
    assert all("\r" not in d for d in docs)
    tokens = builtin_tokens()
    assert tokens.max() == EOS and (tokens == EOS).sum() == len(docs)
    assert len(tokens) > 500_000


@pytest.mark.procs
def test_builtin_corpus_identical_across_hash_seeds():
    code = "from benchsuite.data import make_source; print(make_source('builtin', 257, 64, 0).describe()['sha256'])"
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}) for seed in ("1", "2")]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1] == make_source("builtin", 257, 64, 0).describe()["sha256"]


@pytest.mark.parametrize("name,dtype,high", [("t.bin", np.uint16, 2**16), ("t.u32.bin", np.uint32, 2**32)])
def test_bin_round_trip(tmp_path, name, dtype, high):
    tokens = np.random.default_rng(0).integers(0, high, 5000, dtype=np.int64)
    tokens[0] = high - 1
    path = write_bin(tmp_path / name, tokens, dtype)
    assert path.stat().st_size == 5000 * np.dtype(dtype).itemsize
    src = make_source(str(path), high, 9, 0)
    assert src.vocab_size == high
    assert np.array_equal(np.asarray(src.tokens), tokens)
    x, y = next(src.val_batches(2, 1))
    c = src.val_chunks[0] * 10
    assert x[0].tolist() == tokens[c:c + 9].tolist() and y[0].tolist() == tokens[c + 1:c + 10].tolist()
    desc = src.describe()
    assert desc["kind"] == "bin" and desc["tokens"] == 5000 and desc["corpus"] == str(path.resolve())
    assert desc["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_write_bin_rejects_mismatched_dtype_and_range(tmp_path):
    with pytest.raises(ValueError, match="u32.bin"):
        write_bin(tmp_path / "t.bin", [1, 2], np.uint32)
    with pytest.raises(ValueError, match="must lie in"):
        write_bin(tmp_path / "t.bin", [70000])


def test_split_never_leaks_validation_into_training(tmp_path):
    # Every token id is unique, so any shared token would mean overlapping text.
    path = write_bin(tmp_path / "unique.u32.bin", np.arange(20_000), None)
    src = make_source(str(path), 20_000, 15, seed=3)
    assert set(src.train_chunks).isdisjoint(src.val_chunks)
    assert len(src.train_chunks) + len(src.val_chunks) == 20_000 // 16
    assert len(src.val_chunks) >= data.MIN_VAL_CHUNKS
    val_ids = set(torch.cat([x for x, _ in src.val_batches(8)]).flatten().tolist())
    val_ids |= set(torch.cat([y for _, y in src.val_batches(8)]).flatten().tolist())
    assert len(val_ids) == len(src.val_chunks) * 16
    seen = set()
    for step in range(len(src.train_chunks) // 8 + 2):  # a bit more than one epoch
        x, y = src.batch(step, 0, 1, 8)
        seen |= set(x.flatten().tolist()) | set(y.flatten().tolist())
    assert seen.isdisjoint(val_ids)
    assert len(seen) == len(src.train_chunks) * 16  # the epoch covered every training chunk


def test_builtin_split_disjoint_and_rows_distinct():
    src = make_source("builtin", 300, 64, seed=1)
    assert set(src.train_chunks).isdisjoint(src.val_chunks)
    val_rows = {tuple(r) for x, _ in src.val_batches(64) for r in x.tolist()}
    for step in range(20):
        x, _ = src.batch(step, 0, 1, 16)
        assert val_rows.isdisjoint(tuple(r) for r in x.tolist())
    other = make_source("builtin", 300, 64, seed=2)
    assert not np.array_equal(src.val_chunks, other.val_chunks)
    assert np.array_equal(src.val_chunks, make_source("builtin", 300, 64, seed=1).val_chunks)


@pytest.mark.parametrize("spec", ["synthetic", "builtin", "bin"])
def test_dp_shards_concatenate_to_global_batch(tmp_path, spec):
    if spec == "bin":  # tiny file: a step crosses an epoch boundary
        spec = str(write_bin(tmp_path / "small.bin", np.arange(600) % 1000))
    src = make_source(spec, 1000, 16, seed=5)
    micro, dp = 3, 4
    for step in (0, 1, 7, 40):
        gx, gy = src.batch(step, 0, 1, micro * dp)
        shards = [src.batch(step, r, dp, micro) for r in range(dp)]
        assert torch.equal(torch.cat([s[0] for s in shards]), gx)
        assert torch.equal(torch.cat([s[1] for s in shards]), gy)
        assert gx.dtype == torch.long and gx.shape == (micro * dp, 16)
        assert torch.equal(gx[:, 1:], gy[:, :-1])


def test_synthetic_ids_in_vocab_and_deterministic():
    a = make_source("synthetic", 50, 32, seed=0)
    x, y = a.batch(2, 1, 2, 4)
    assert x.shape == y.shape == (4, 32) and x.dtype == torch.long
    assert 0 <= int(x.min()) and int(x.max()) < 50
    assert torch.equal(x, make_source("synthetic", 50, 32, seed=0).batch(2, 1, 2, 4)[0])
    assert not torch.equal(x, make_source("synthetic", 50, 32, seed=1).batch(2, 1, 2, 4)[0])
    assert not torch.equal(x, a.batch(3, 1, 2, 4)[0])
    val = list(a.val_batches(10, 3))
    assert len(val) == 3 and all(torch.equal(v[0], w[0]) for v, w in zip(val, a.val_batches(10, 3)))
    assert a.vocab_size == 50 and a.describe()["kind"] == "synthetic"


def test_missing_path_error_names_key_path_and_fix(tmp_path):
    missing = tmp_path / "nope.bin"
    for err in (check_data_spec(str(missing)), _error(str(missing))):
        assert "train.data" in err and str(missing) in err and "benchsuite tokenize" in err
    (tmp_path / "t.txt").write_text("hi")
    assert "not a .bin" in check_data_spec("t.txt", base_dir=tmp_path)
    assert check_data_spec("synthetic") is None and check_data_spec("builtin") is None


def test_too_small_vocab_error_names_both_keys():
    err = _error("builtin", vocab=256)
    assert "train.data" in err and "model.vocab" in err and "257" in err


def test_corpus_too_small_for_seq_len(tmp_path):
    path = write_bin(tmp_path / "tiny.bin", np.arange(40))
    assert "model.seq_len" in _error(str(path), seq_len=16)


def _error(spec, vocab=1000, seq_len=16):
    with pytest.raises(ValueError) as info:
        make_source(spec, vocab, seq_len, 0)
    return str(info.value)


@pytest.mark.procs
def test_tokenize_cli_writes_the_bytes_of_each_file_then_eos_and_the_source_reads_them(tmp_path):
    from helpers import run_cli

    docs = ["héllo wörld\n" * 40, "ünïcode ✓ second document", ""]
    files = []
    for i, text in enumerate(docs):
        files.append(tmp_path / f"doc{i}.txt")
        files[-1].write_text(text, encoding="utf-8")
    out = tmp_path / "data" / "train.bin"
    # a 7-byte chunk size splits multi-byte characters across chunks: the UTF-8 check must not trip
    doc = data.tokenize_files(files, out, chunk_bytes=7)
    expected = np.concatenate([np.append(encode(t), EOS) for t in docs]).astype("<u2")
    assert np.array_equal(np.fromfile(out, dtype="<u2"), expected)
    assert doc["tokens"] == len(expected) and doc["sha256"] == hashlib.sha256(expected.tobytes()).hexdigest()
    src = make_source(str(out), BYTE_VOCAB, 16, seed=0)
    assert src.sha256() == doc["sha256"]  # the hash a run's record will carry for this file
    assert decode(src.tokens) == "<eos>".join(docs) + "<eos>"

    res = run_cli("tokenize", *map(str, files), "-o", str(tmp_path / "cli.bin"), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["sha256"] == doc["sha256"]


@pytest.mark.procs
@pytest.mark.parametrize("bad, words", [
    (b"ok\xff\xfe then binary", "invalid byte at offset 2"),
    (b"ends mid character \xe2\x9c", "truncated character"),
    (None, "no such text file"),
])
def test_tokenize_refuses_non_text_naming_the_file_and_leaves_no_output(tmp_path, bad, words):
    from helpers import run_cli

    good, src = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text("fine")
    if bad is not None:
        src.write_bytes(bad)
    out = tmp_path / "out.bin"
    res = run_cli("tokenize", str(good), str(src), "-o", str(out))
    assert res.returncode == 2 and str(src) in res.stderr and words in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert sorted(tmp_path.iterdir()) == sorted([good, src] if bad is not None else [good])  # no .bin, no temp


def test_a_sweeps_runs_sharing_a_token_file_scan_it_once_until_it_changes(tmp_path, monkeypatch):
    """Validation opens every run's data before launch (ids below model.vocab): a sweep's runs share the
    file, and a multi-GB file is scanned for its largest id once, again only after it changed."""
    from benchsuite.config import ConfigError
    from benchsuite.config.preflight import parse_suite

    tokens = tmp_path / "t.bin"
    write_bin(tokens, list(range(300)) * 4)
    scans = []
    scan = data._max_token
    monkeypatch.setattr(data, "_max_token", lambda t: scans.append(len(t)) or scan(t))
    data._file_max_token.cache_clear()
    doc = {"defaults": {"model": {"layers": 1, "hidden": 32, "heads": 2, "vocab": 512, "seq_len": 16},
                        "train": {"data": str(tokens)}},
           "workload": [{"name": "w"}], "sweep": {"world_size": [1, 2, 4]}}
    assert len(parse_suite(doc).runs) == 3 and scans == [1200]
    write_bin(tokens, list(range(400)) * 4)  # another file at that path: scanned again, its ids checked
    with pytest.raises(ConfigError, match="largest token id is 399"):
        parse_suite({**doc, "defaults": {**doc["defaults"], "model": {**doc["defaults"]["model"], "vocab": 390}}})
    assert scans == [1200, 1600]


def test_the_builtin_corpus_ignores_methods_other_packages_add_to_the_standard_library():
    """transformers adds logging.Logger.warning_once: importing it must not change the corpus (and so the
    in-process runs of a test pass) with what happened to be imported before."""
    from benchsuite.data import builtin_documents

    before = builtin_documents()
    import logging

    logging.Logger.added_by_a_package = lambda self: None
    logging.Logger.added_by_a_package.__doc__ = "A method another package added."
    logging.Logger.added_by_a_package.__module__ = "somepackage.patches"
    try:
        assert builtin_documents() == before
    finally:
        del logging.Logger.added_by_a_package
