"""`train_gpt prepare` streaming into shards: bounded memory on an input of several hundred MB
(under an address-space limit, token for token equal to the in-memory encoder and to tiktoken),
JSONL with odd lines, gzip and zstd equal to plain input, directories, globs and standard input,
an interrupted run that leaves only complete shards and resumes to the same bytes, the trainer
reading the shards, the progress line, and bad input (exit code 2, a message, nothing half
written).

Drives ./train_gpt prepare and build/tests/tools/bpe_encode (make test builds both)."""
import ctypes
import ctypes.util
import gzip
import json
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

try:
    import tiktoken
except ImportError as e:   # the oracle is required, not optional: fail loudly
    raise ImportError("tiktoken is missing: /usr/bin/python3 -m pip install "
                      "--break-system-packages tiktoken (scripts/setup.sh does this)") from e
from tiktoken.load import data_gym_to_mergeable_bpe_ranks  # noqa: E402
from tiktoken_ext.openai_public import r50k_pat_str  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data_files import GPT2_ENCODER, GPT2_VOCAB, SHAKESPEARE  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "train_gpt")
BPE_TOOL = os.path.join(ROOT, os.environ.get("BUILD", "build"), "tests", "tools", "bpe_encode")
EOT = 50256
GPT2 = ["--tokenizer", "gpt2", "--encoder", GPT2_ENCODER, "--vocab-bpe", GPT2_VOCAB]
MB = 1 << 20


def prepare(*args, **kw):
    return subprocess.run([BIN, "prepare", *args], capture_output=True, cwd=ROOT, timeout=600, **kw)


def ok(*args, **kw):
    r = prepare(*args, **kw)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r


@pytest.fixture(scope="module")
def enc():
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=GPT2_VOCAB, encoder_json_file=GPT2_ENCODER)
    return tiktoken.Encoding("gpt2_local", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=50257)


def read_shard(path):
    """The tokens of one shard, after checking its header against its size."""
    header = np.fromfile(path, dtype="<i4", count=256)
    magic, version, n = (int(x) for x in header[:3])
    assert (magic, version) in ((20240520, 1), (20240801, 7)), path
    width = 2 if version == 1 else 4
    assert os.path.getsize(path) == 1024 + n * width, path
    return np.fromfile(path, dtype="<u2" if width == 2 else "<u4", offset=1024)


def shards(prefix, split):
    d, base = os.path.split(prefix)
    names = sorted(f for f in (os.listdir(d) if os.path.isdir(d) else [])
                   if f.startswith(f"{base}_{split}_") and f.endswith(".bin"))
    return [os.path.join(d, f) for f in names]


def tokens(prefix, split):
    paths = shards(prefix, split)
    return np.concatenate([read_shard(p) for p in paths]) if paths else np.zeros(0, np.uint16)


def files_under(d):
    return {os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs}


def doc_ids(enc, texts):
    """llm.c's convention: <|endoftext|> then the document's ids, for every document."""
    out = []
    for t in texts:
        out.append(EOT)
        out.extend(enc.encode_ordinary(t))
    return np.array(out, dtype=np.int64)


def shakespeare_units():
    """tinyshakespeare's paragraphs, each ending in '\\n', kept when it starts and ends with a
    printable ASCII character: then every junction "x\\ny" is one where GPT-2's pre-tokenizer
    always splits, so the ids of a text made of units are the units' ids one after the other."""
    text = open(SHAKESPEARE, encoding="utf-8").read()
    return [p + "\n" for p in text.split("\n\n") if p and 32 < ord(p[0]) < 127 and 32 < ord(p[-1]) < 127]


# ---------------------------------------------------------------------------------------------
# memory: several hundred MB under 1 GiB of address space beyond what the binary maps before
# reading, the same ids as in memory


LARGE_MB = 300
AS_HEADROOM = 1 << 30
RSS_BOUND_MB = 200   # beyond the binary's own; docs/formats.md: about 100 MB for text on 2 threads, 2x allowed


def baseline_memory(tmp_path, env):
    """(address space, resident bytes) prepare holds before it reads any input: the binary and
    its libraries (a CUDA build maps several GB of them and keeps tens of MB resident) and its
    threads. Measured on a prepare that waits for its standard input."""
    p = subprocess.Popen([BIN, "prepare", *GPT2, "--input", "-", "--out", str(tmp_path / "probe" / "p"),
                          "--val-tokens", "0"], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        size, rss, stable = 0, 0, 0
        # Until VmSize and VmRSS both stop growing (at most 10 s): on a loaded machine the process
        # may still be touching the pages of its start-up after its mappings are complete.
        for _ in range(100):
            time.sleep(0.1)
            with open(f"/proc/{p.pid}/status") as f:
                fields = {l.split(":")[0]: l.split()[1] for l in f if l.startswith(("VmSize:", "VmRSS:"))}
            now = (int(fields["VmSize"]) * 1024, int(fields["VmRSS"]) * 1024)
            stable = stable + 1 if now == (size, rss) else 0
            size, rss = now
            if stable >= 5:
                break
        return size, rss
    finally:
        p.stdin.close()
        p.wait()


def test_large_input_bounded_memory_same_ids(tmp_path, enc):
    units = shakespeare_units()
    rng = np.random.default_rng(0)
    mean = sum(map(len, units)) / len(units)
    order = rng.integers(0, len(units), int(LARGE_MB * 1e6 / mean))
    src = tmp_path / "large.txt"
    with open(src, "w", encoding="utf-8") as f:
        f.write("".join(units[i] for i in order))
    size = os.path.getsize(src)
    assert size > 250e6
    # The unit property the expected ids rely on, checked on a sample.
    sample = [units[i] for i in order[:300]]
    assert enc.encode_ordinary("".join(sample)) == [t for u in sample for t in enc.encode_ordinary(u)]

    prefix = str(tmp_path / "out" / "large")
    env = dict(os.environ, OMP_NUM_THREADS="2")   # the bound grows with the threads (formats.md)
    base_as, base_rss = baseline_memory(tmp_path, env)
    limit = base_as + AS_HEADROOM

    def limit_address_space():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        p = subprocess.Popen([BIN, "prepare", *GPT2, "--input", str(src), "--out", prefix, "--shard-tokens",
                              "20000000", "--val-tokens", "0"], cwd=ROOT, env=env, stdout=fo, stderr=fe,
                             preexec_fn=limit_address_space)
        _, status, usage = os.wait4(p.pid, 0)   # this child's own peak RSS
        p.returncode = os.waitstatus_to_exitcode(status)
    assert p.returncode == 0, err.read_text()
    rss_mb = (usage.ru_maxrss * 1024 - base_rss) / 1e6   # what reading and tokenizing added
    print(f"prepare of {size / 1e6:.0f} MB: peak RSS {rss_mb:.0f} MB above the binary's own; {out.read_text().strip().splitlines()[-1]}")
    assert rss_mb < RSS_BOUND_MB, rss_mb
    got = tokens(prefix, "train")
    assert len(shards(prefix, "train")) == -(-len(got) // 20000000) and not shards(prefix, "val")

    pool = [np.array(enc.encode_ordinary(u), dtype=np.uint16) for u in units]   # tiktoken, per unit
    expect = np.concatenate([np.array([EOT], np.uint16)] + [pool[i] for i in order])
    assert len(got) == len(expect) and np.array_equal(got, expect)
    del expect, pool
    ids = tmp_path / "ids.bin"   # the in-memory encoder on the whole text
    subprocess.run([BPE_TOOL, "--encoder", GPT2_ENCODER, "--vocab", GPT2_VOCAB, "--threads", "0", "--out", str(ids),
                    str(src)], check=True, capture_output=True, timeout=600)
    whole = np.fromfile(ids, dtype="<i4")
    assert got[0] == EOT and len(whole) == len(got) - 1 and np.array_equal(got[1:], whole)


# ---------------------------------------------------------------------------------------------
# JSONL


def jsonl_cases():
    """(line bytes, text or None when the line is malformed) in file order."""
    big = "".join(shakespeare_units()[:40000])[:6_000_000]   # one document over several segments
    good = [
        (json.dumps({"text": "Hello world.", "id": 1}).encode(), "Hello world."),
        (b"", None), (b"   \t", None),   # blank: skipped without a word
        (b'{"text": 5}', None),
        (b'{"id": 2}', None),
        (json.dumps({"text": "caf\u00e9 \U0001F600 tab\tnul\x00end", "meta": {"a": [1, 2, {"b": None}]}}).encode(),
         "caf\u00e9 \U0001F600 tab\tnul\x00end"),
        (b'{"text": "bad \xff byte"}', None),   # invalid UTF-8: Python's json refuses it too
        (b'{"text": "cut', None),
        (b'{"text": "\\ud800"}', None),
        (b'{"text": "first", "text": "last wins"}', "last wins"),
        (b'[1, 2]', None),
        (json.dumps({"text": big}, ensure_ascii=False).encode(), big),
        (b'{"text": "crlf line"}\r', "crlf line"),
        (b'{"text": ""}', ""),   # empty: left out
        (json.dumps({"text": "no newline at the end"}).encode(), "no newline at the end"),
    ]
    return good


def write_jsonl(path, cases):
    path.write_bytes(b"\n".join(line for line, _ in cases))


def test_jsonl_odd_lines(tmp_path, enc):
    cases = jsonl_cases()
    src = tmp_path / "docs.jsonl"
    write_jsonl(src, cases)
    prefix = str(tmp_path / "j")
    r = ok(*GPT2, "--input", str(src), "--out", prefix, "--jsonl-field", "text", "--val-tokens", "1")
    texts = [t for _, t in cases if t]
    expect = doc_ids(enc, texts)
    val, train = tokens(prefix, "val"), tokens(prefix, "train")
    assert np.array_equal(np.concatenate([val, train]), expect)
    assert np.array_equal(val, doc_ids(enc, texts[:1]))   # val: the first whole document
    err, out = r.stderr.decode(), r.stdout.decode()
    bad_lines = [i + 1 for i, (line, t) in enumerate(cases) if t is None and line.strip()]
    for n in bad_lines:
        assert f"docs.jsonl:{n}:" in err, (n, err)
    assert "docs.jsonl:2:" not in err and "docs.jsonl:3:" not in err   # blank lines are not malformed
    assert 'field "text" is a number' in err and 'no field "text"' in err and "invalid UTF-8" in err
    assert f"documents: {len(texts)}, {len(bad_lines)} malformed JSONL lines skipped, 1 empty documents left out" in out


def test_jsonl_strict_stops_and_leaves_nothing(tmp_path):
    src = tmp_path / "docs.jsonl"
    write_jsonl(src, jsonl_cases())
    out = tmp_path / "out"
    r = prepare(*GPT2, "--input", str(src), "--out", str(out / "j"), "--jsonl-field", "text", "--val-tokens", "1",
                "--jsonl-strict")
    assert r.returncode == 2 and b"docs.jsonl:4: field \"text\" is a number" in r.stderr, r.stderr
    assert files_under(out) == set()   # no shard was complete: the run's files are gone


def test_jsonl_other_field_and_char_vocabulary(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"body": "abc\u00e9"}) + "\n" + json.dumps({"body": "zz"}) + "\n")
    b.write_text(json.dumps({"body": "\u20ac!", "text": "ignored"}) + "\n")
    prefix = str(tmp_path / "c")
    ok("--tokenizer", "char", "--input", str(a), str(b), "--out", prefix, "--jsonl-field", "body", "--val-tokens", "1")
    chars = sorted(set("abc\u00e9zz\u20ac!"))   # the vocabulary of every document, no end-of-text
    stoi = {c: i for i, c in enumerate(chars)}
    with open(prefix + "_tokenizer.bin", "rb") as f:
        blob = f.read()
    assert struct.unpack_from("<4I", blob)[2:] == (len(chars), 0xFFFFFFFF)
    assert list(tokens(prefix, "val")) == [stoi[c] for c in "abc\u00e9"]
    assert list(tokens(prefix, "train")) == [stoi[c] for c in "zz\u20ac!"]


# ---------------------------------------------------------------------------------------------
# compressed input, several inputs, directories, globs, standard input


def zstd_compress(data):
    lib = ctypes.CDLL(ctypes.util.find_library("zstd") or "libzstd.so.1")
    lib.ZSTD_compressBound.restype = ctypes.c_size_t
    lib.ZSTD_compress.restype = ctypes.c_size_t
    lib.ZSTD_isError.restype = ctypes.c_uint
    cap = lib.ZSTD_compressBound(ctypes.c_size_t(len(data)))
    dst = ctypes.create_string_buffer(cap)
    n = lib.ZSTD_compress(dst, ctypes.c_size_t(cap), data, ctypes.c_size_t(len(data)), 3)
    assert not lib.ZSTD_isError(ctypes.c_size_t(n))
    return dst.raw[:n]


def all_shard_bytes(prefix):
    return [open(p, "rb").read() for p in shards(prefix, "val") + shards(prefix, "train")]


@pytest.mark.parametrize("kind", ["text", "jsonl"])
def test_gzip_and_zstd_equal_plain(tmp_path, kind):
    if kind == "jsonl":
        plain = b"\n".join(line for line, _ in jsonl_cases())
        opts = ["--jsonl-field", "text"]
    else:
        plain = "".join(shakespeare_units()[:3000]).encode()
        opts = ["--doc-separator", "\\n"]
    half = len(plain) // 2
    variants = {"plain": plain,
                "gz": gzip.compress(plain[:half]) + gzip.compress(plain[half:]),   # two members
                "zst": zstd_compress(plain[:half]) + zstd_compress(plain[half:])}   # two frames
    results = {}
    for name, data in variants.items():
        src = tmp_path / f"in.{name}"   # the codec comes from the bytes, not the name
        src.write_bytes(data)
        prefix = str(tmp_path / name / "x")
        ok(*GPT2, "--input", str(src), "--out", prefix, "--val-tokens", "100", "--shard-tokens", "5000", *opts)
        results[name] = all_shard_bytes(prefix)
    assert len(results["plain"]) > 2
    assert results["gz"] == results["plain"] and results["zst"] == results["plain"]


def test_inputs_files_directory_glob_stdin(tmp_path, enc):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    texts = {"b.txt": "Second file.\n", "a.txt": "First file, first.\n", "sub/c.txt": "Third: below.\n"}
    for name, t in texts.items():
        (d / name).write_text(t)
    (d / ".hidden").write_text("left out")
    (d / "empty.txt").write_text("")   # an empty document: left out
    in_order = [texts["a.txt"], texts["b.txt"], texts["sub/c.txt"]]   # sorted paths
    expect = doc_ids(enc, in_order)
    for i, inputs in enumerate([[str(d)], [str(d / "*.txt"), str(d / "sub" / "c.txt")],
                                [str(d / "a.txt"), str(d / "b.txt"), str(d / "sub" / "c.txt")]]):
        prefix = str(tmp_path / f"o{i}" / "x")
        ok(*GPT2, "--input", *inputs, "--out", prefix, "--val-tokens", "1")
        assert np.array_equal(np.concatenate([tokens(prefix, "val"), tokens(prefix, "train")]), expect), inputs
    prefix = str(tmp_path / "stdin" / "x")
    ok(*GPT2, "--input", "-", "--out", prefix, "--val-tokens", "1", "--doc-separator", "\\n",
       input="".join(in_order).encode())
    assert np.array_equal(np.concatenate([tokens(prefix, "val"), tokens(prefix, "train")]), expect)


def test_val_fraction_takes_whole_documents_from_the_start(tmp_path, enc):
    units = shakespeare_units()[:400]
    src = tmp_path / "in.txt"
    src.write_text("".join(units))
    prefix = str(tmp_path / "f")
    ok(*GPT2, "--input", str(src), "--out", prefix, "--doc-separator", "\\n", "--shard-tokens", "1000000")
    # Documents are the lines; val ends with the first document that starts at or after 10% of
    # the bytes (the default --val-fraction 0.1).
    lines = [ln + "\n" for ln in "".join(units).split("\n")[:-1]]
    goal, pos, n_val = 0.1 * os.path.getsize(src), 0, 0
    for ln in lines:
        if n_val and pos >= goal:
            break
        pos += len(ln.encode())
        n_val += 1
    assert np.array_equal(tokens(prefix, "val"), doc_ids(enc, lines[:n_val]))
    assert np.array_equal(tokens(prefix, "train"), doc_ids(enc, lines[n_val:]))


# ---------------------------------------------------------------------------------------------
# interrupted and resumed


def shard_is_complete(path):
    read_shard(path)   # asserts the header matches the size
    return True


@pytest.mark.parametrize("kind", ["text", "jsonl"])
def test_killed_prepare_leaves_whole_shards_and_resumes_identically(tmp_path, kind):
    units = shakespeare_units()
    rng = random.Random(1)
    body = "".join(rng.choice(units) for _ in range(330000))   # 50 MB: three batches of 2 threads
    if kind == "jsonl":
        src = tmp_path / "in.jsonl"
        lines = body.split("\n")
        src.write_text("\n".join(json.dumps({"text": "\n".join(lines[i:i + 30])}) for i in range(0, len(lines), 30)))
        opts = ["--jsonl-field", "text"]
    else:   # three files: whole-file documents, cut mid-document into many segments
        third = len(body) // 3
        srcs = []
        for k in range(3):
            f = tmp_path / f"in{k}.txt"
            f.write_text(body[k * third:(k + 1) * third])
            srcs.append(str(f))
        opts = []
    inputs = [str(src)] if kind == "jsonl" else srcs
    args = [*GPT2, "--input", *inputs, "--shard-tokens", "250000", "--val-tokens", "300000", "--threads", "2", *opts]
    ok(*args, "--out", str(tmp_path / "full" / "x"))
    expect = all_shard_bytes(str(tmp_path / "full" / "x"))
    out = tmp_path / "cut"
    prefix = str(out / "x")
    p = subprocess.Popen([BIN, "prepare", *args, "--out", prefix], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while p.poll() is None and time.time() < deadline and len(shards(prefix, "train")) < 4:
        time.sleep(0.02)
    assert p.poll() is None, "prepare ended before it could be interrupted: give it more input"
    p.send_signal(signal.SIGKILL)
    p.wait()
    done = shards(prefix, "train")
    assert len(done) >= 4 and shards(prefix, "val")
    for path in shards(prefix, "val") + done:   # every file under a shard's name is complete
        assert shard_is_complete(path)
    leftovers = {os.path.basename(f) for f in files_under(out)} - {os.path.basename(f) for f in shards(prefix, "val") + done}
    assert all(".tmp." in f for f in leftovers - {"x_prepare_state.json", "x_tokenizer.bin"}), leftovers
    r = prepare(*args, "--out", prefix)   # without --resume: refused, nothing touched
    assert r.returncode == 2 and b"--resume" in r.stderr
    r = ok(*args, "--out", prefix, "--resume")
    assert all_shard_bytes(prefix) == expect
    assert not [f for f in files_under(out) if ".tmp." in f], "the killed run's temporary file is removed"
    r = ok(*args, "--out", prefix, "--resume")
    assert b"complete already" in r.stdout


def test_resume_refuses_other_settings(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("".join(shakespeare_units()[:200]))
    prefix = str(tmp_path / "o" / "x")
    args = [*GPT2, "--input", str(src), "--out", prefix, "--doc-separator", "\\n", "--val-tokens", "100"]
    ok(*args, "--shard-tokens", "3000")
    before = {f: open(f, "rb").read() for f in files_under(tmp_path / "o")}
    r = prepare(*args, "--shard-tokens", "4000", "--resume")
    assert r.returncode == 2 and b"--shard-tokens was 3000 in the interrupted run and is 4000 now" in r.stderr
    src.write_text("changed")
    r = prepare(*args, "--shard-tokens", "3000", "--resume")
    assert r.returncode == 2 and b"input file 1 was" in r.stderr
    os.unlink(prefix + "_prepare_state.json")
    r = prepare(*args, "--shard-tokens", "3000", "--resume")
    assert r.returncode == 2 and b"where it stopped is unknown" in r.stderr
    del before[prefix + "_prepare_state.json"]
    assert {f: open(f, "rb").read() for f in files_under(tmp_path / "o")} == before


# ---------------------------------------------------------------------------------------------
# the trainer reads the shards; progress and summary


def test_trainer_reads_the_shards(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("".join(shakespeare_units()[:1500]))
    prefix = str(tmp_path / "d" / "s")
    ok(*GPT2, "--input", str(src), "--out", prefix, "--doc-separator", "\\n", "--val-tokens", "5000",
       "--shard-tokens", "20000")
    assert len(shards(prefix, "train")) >= 3
    cfg = {"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 50257, "max_seq_len": 32},
           "data": {"train": prefix + "_train_*.bin", "val": prefix + "_val_*.bin",
                    "tokenizer": prefix + "_tokenizer.bin"},
           "train": {"batch_size": 2, "seq_len": 32, "steps": 2, "seed": 1},
           "precision": {"dtype": "fp32"},
           "log": {"dir": str(tmp_path / "run"), "every": 1, "eval_every": 2, "eval_tokens": 256, "sample_every": 0,
                   "checkpoint_every": 2}}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    r = subprocess.run([BIN, "train", "-c", str(tmp_path / "cfg.json"), "--device", "cpu"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([BIN, "eval", "--checkpoint", str(tmp_path / "run" / "ckpt_00000002"), "--data",
                        prefix + "_val_*.bin", "--device", "cpu"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and "val_loss:" in r.stdout, r.stderr
    loss = float(r.stdout.split("val_loss:")[1])
    assert 9 < loss < 12   # about ln(50257) = 10.8 for an untrained model


def test_progress_line_and_summary(tmp_path):
    src = tmp_path / "in.txt"
    units, rng = shakespeare_units(), random.Random(2)
    # 80 MB: over 1.5 s of tokenizing on one thread even on a quiet machine (about 33 MB/s)
    src.write_text("".join(rng.choice(units) for _ in range(540000)))
    prefix = str(tmp_path / "p")
    t0 = time.time()
    r = ok(*GPT2, "--input", str(src), "--out", prefix, "--doc-separator", "\\n", "--val-tokens", "1000",
           "--shard-tokens", "2000000", "--threads", "1")
    elapsed = time.time() - t0
    err, out = r.stderr.decode(), r.stdout.decode()
    lines = [ln for ln in err.splitlines() if ln.startswith("prepare: tokenizing")]
    assert elapsed > 1.5 and lines, (elapsed, err)
    assert all("MB (" in ln and "M tokens" in ln and "MB/s" in ln and "shard" in ln and "ETA" in ln for ln in lines)
    assert len(lines) <= elapsed / 5 + 2   # not a log line per batch (stderr is not a terminal)
    assert "documents: " in out and "tokens in" in out and "shards ->" in out and " s (" in out and "MB/s" in out
    small = tmp_path / "small.txt"
    small.write_text("A short text.\n")
    r = ok(*GPT2, "--input", str(small), "--out", str(tmp_path / "q"), "--val-tokens", "0")
    assert b"tokenizing" not in r.stderr   # a short run prints no progress


# ---------------------------------------------------------------------------------------------
# bad input: exit code 2, a message that names the problem, nothing half written


@pytest.fixture
def text_file(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n")
    return str(src)


BAD = [
    (["--input", "{tmp}/missing*.txt", "--val-tokens", "1"], "no file matches the pattern"),
    (["--input", "{tmp}/emptydir", "--val-tokens", "1"], "holds no files"),
    (["--input", "{text}", "{text}", "--val-tokens", "1"], "already an input"),
    (["--input", "{text}", "--shard-tokens", "0"], "--shard-tokens: expected an integer in [1, 2147483647], got '0'"),
    (["--input", "{text}", "--shard-tokens", "1e8"], "--shard-tokens: expected an integer"),
    (["--input", "{text}", "--val-tokens", "-1"], "--val-tokens: expected an integer"),
    (["--input", "{text}", "--threads", "0"], "--threads"),
    (["--input", "{text}", "--val-tokens", "5", "--val-fraction", "0.1"], "not both"),
    (["--input", "{text}", "--jsonl-strict"], "--jsonl-strict needs --jsonl-field"),
    (["--input", "{text}", "--jsonl-field", "text", "--doc-separator", "x"], "every line is one document"),
    (["--input", "-", "--val-fraction", "0.1"], "give --val-tokens N"),
    (["--input", "-", "--val-tokens", "1", "--resume"], "standard input cannot"),
    (["--input", "{text}.xz", "--val-tokens", "1"], "xz-compressed"),
    (["--input", "{text}", "--out", "{tmp}/afile/sub/p", "--val-tokens", "1"], "afile"),
    (["--input", "{text}", "--val-tokens", "1000000"], "every document went to val"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_bad_input(tmp_path, text_file, args, message):
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "afile").write_text("a regular file where a directory should be")
    with open(text_file + ".xz", "wb") as f:
        f.write(b"\xfd7zXZ\x00" + b"\x00" * 20)
    args = [a.format(tmp=tmp_path, text=text_file) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "out" / "p")]
    before = files_under(tmp_path)
    r = prepare(*GPT2, *args, input=b"stdin text\n")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert b"error: prepare: " in r.stderr and message.encode() in r.stderr, r.stderr
    assert files_under(tmp_path) == before


def test_char_cannot_read_stdin(tmp_path):
    r = prepare("--tokenizer", "char", "--input", "-", "--out", str(tmp_path / "c"), "--val-tokens", "1", input=b"x")
    assert r.returncode == 2 and b"reads its input twice" in r.stderr and not files_under(tmp_path)


def test_truncated_gzip_midway_keeps_only_whole_shards(tmp_path):
    data = gzip.compress("".join(shakespeare_units()[:3000]).encode())
    src = tmp_path / "cut.gz"
    src.write_bytes(data[:len(data) * 2 // 3])
    prefix = str(tmp_path / "o" / "x")
    r = prepare(*GPT2, "--input", str(src), "--out", prefix, "--doc-separator", "\\n", "--val-tokens", "100",
                "--shard-tokens", "5000")
    assert r.returncode == 2 and b"truncated" in r.stderr and b"cut.gz" in r.stderr, r.stderr
    names = {os.path.basename(f) for f in files_under(tmp_path / "o")}
    assert not [n for n in names if ".tmp." in n]
    for path in shards(prefix, "val") + shards(prefix, "train"):
        assert shard_is_complete(path)


def test_existing_outputs_need_resume(tmp_path, text_file):
    prefix = str(tmp_path / "o" / "x")
    args = [*GPT2, "--input", text_file, "--out", prefix, "--val-tokens", "0"]
    ok(*args)
    r = prepare(*args)
    assert r.returncode == 2 and b"add --resume to continue it, or remove" in r.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
