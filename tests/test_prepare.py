"""`train_gpt prepare`: nanoGPT's numbers on tinyshakespeare, the file formats as llm.c reads
them, and every bad input (exit code 2, a message, no output file left behind).

Drives ./train_gpt prepare (make test builds it first)."""
import array
import json
import os
import struct
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data_files import GPT2_ENCODER, GPT2_VOCAB, SHAKESPEARE  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


PREPARE = [os.environ.get("TRAIN_GPT", os.path.join(ROOT, "train_gpt")), "prepare"]


def run(*args):
    return subprocess.run(PREPARE + list(args), capture_output=True, text=True, cwd=ROOT)


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n = struct.unpack_from("<3i", data)
    assert (magic, version) in ((20240520, 1), (20240801, 7))
    assert len(data) == 1024 + n * (2 if version == 1 else 4)
    tokens = array.array("H" if version == 1 else "I")
    tokens.frombytes(data[1024:])
    return version, list(tokens)


def read_tokenizer(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n, eot = struct.unpack_from("<4I", data)
    assert (magic, version) == (20240328, 2)
    pos, tokens = 1024, []
    for _ in range(n):
        length = data[pos]
        assert length > 0
        tokens.append(data[pos + 1:pos + 1 + length])
        pos += 1 + length
    assert pos == len(data)
    return tokens, eot


def outputs(prefix):
    return [prefix + s for s in ("_train.bin", "_val.bin", "_tokenizer.bin")]


def test_tinyshakespeare_char_matches_nanogpt(tmp_path):
    prefix = str(tmp_path / "sub" / "dir" / "shakespeare_char")
    r = run("--tokenizer", "char", "--input", SHAKESPEARE, "--out", prefix)
    assert r.returncode == 0, r.stderr
    assert "vocab size 65" in r.stdout and "1003854" in r.stdout and "111540" in r.stdout
    # nanoGPT's data/shakespeare_char/prepare.py, step by step
    with open(SHAKESPEARE, "r") as f:
        text = f.read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    n = len(text)
    train_ids = [stoi[c] for c in text[:int(n * 0.9)]]
    val_ids = [stoi[c] for c in text[int(n * 0.9):]]
    assert (len(chars), len(train_ids), len(val_ids)) == (65, 1003854, 111540)
    train, val, tok = outputs(prefix)
    assert read_shard(train) == (1, train_ids)
    assert read_shard(val) == (1, val_ids)
    tokens, eot = read_tokenizer(tok)
    assert [t.decode("utf-8") for t in tokens] == chars
    assert eot == 0xFFFFFFFF


def test_byte_tokenizer_splits_by_characters(tmp_path):
    text = "ab\u00e9cd\u20acfghi"   # 10 characters, 14 bytes: the split counts characters
    src = tmp_path / "in.txt"
    src.write_bytes(text.encode("utf-8"))
    prefix = str(tmp_path / "b")
    r = run("--tokenizer", "byte", "--input", str(src), "--out", prefix, "--val-fraction", "0.3")
    assert r.returncode == 0, r.stderr
    train, val, tok = outputs(prefix)
    cut = int(len(text) * (1 - 0.3))
    assert read_shard(train) == (1, list(text[:cut].encode("utf-8")))
    assert read_shard(val) == (1, list(text[cut:].encode("utf-8")))
    tokens, eot = read_tokenizer(tok)
    assert tokens == [bytes([i]) for i in range(256)] and eot == 0xFFFFFFFF


def test_byte_tokenizer_accepts_non_utf8(tmp_path):
    src = tmp_path / "bin.txt"
    src.write_bytes(bytes(range(256)) * 4)
    prefix = str(tmp_path / "raw")
    r = run("--tokenizer", "byte", "--input", str(src), "--out", prefix)
    assert r.returncode == 0, r.stderr
    _, train = read_shard(outputs(prefix)[0])
    _, val = read_shard(outputs(prefix)[1])
    assert train + val == list(range(256)) * 4 and len(train) == int(1024 * 0.9)


def test_char_tokenizer_utf8(tmp_path):
    text = "\u00e9t\u00e9 \u20ac \U0001F600 \u00e9t\u00e9\n"
    src = tmp_path / "u.txt"
    src.write_bytes(text.encode("utf-8"))
    prefix = str(tmp_path / "u")
    r = run("--tokenizer", "char", "--input", str(src), "--out", prefix, "--val-fraction", "0.5")
    assert r.returncode == 0, r.stderr
    chars = sorted(set(text))
    tokens, _ = read_tokenizer(outputs(prefix)[2])
    assert [t.decode("utf-8") for t in tokens] == chars
    stoi = {c: i for i, c in enumerate(chars)}
    cut = int(len(text) * 0.5)
    assert read_shard(outputs(prefix)[0])[1] == [stoi[c] for c in text[:cut]]
    assert read_shard(outputs(prefix)[1])[1] == [stoi[c] for c in text[cut:]]


def test_help():
    r = run("--help")
    assert r.returncode == 0 and "--tokenizer" in r.stdout and "--val-fraction" in r.stdout


def files_under(d):
    return {os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs}


def expect_bad(tmp_path, args, message):
    """Exit code 2, an error naming the problem, and no file written."""
    before = files_under(tmp_path)
    if "--out" not in args:
        args = args + ["--out", str(tmp_path / "out" / "p")]
    r = run(*args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "error" in r.stderr and message in r.stderr, r.stderr
    assert files_under(tmp_path) == before


@pytest.fixture
def small_input(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n")
    return str(src)


def test_missing_input(tmp_path):
    expect_bad(tmp_path, ["--tokenizer", "char", "--input", str(tmp_path / "nope.txt")], "nope.txt")


def test_unknown_tokenizer(tmp_path, small_input):
    expect_bad(tmp_path, ["--tokenizer", "words", "--input", small_input], "words")


@pytest.mark.parametrize("fraction", ["0", "1", "-0.5", "1.5", "abc", "nan"])
def test_val_fraction_out_of_range(tmp_path, small_input, fraction):
    expect_bad(tmp_path, ["--tokenizer", "char", "--input", small_input, "--val-fraction", fraction],
               "--val-fraction")


def test_empty_input(tmp_path):
    src = tmp_path / "empty.txt"
    src.write_bytes(b"")
    expect_bad(tmp_path, ["--tokenizer", "byte", "--input", str(src)], "empty")


def test_too_short_for_both_splits(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("a")
    expect_bad(tmp_path, ["--tokenizer", "char", "--input", str(src)], "too few")


def test_invalid_utf8_for_char(tmp_path):
    src = tmp_path / "bad.txt"
    src.write_bytes(b"hello \xff world")
    expect_bad(tmp_path, ["--tokenizer", "char", "--input", str(src)], "byte offset 6")


def test_unwritable_output(tmp_path, small_input):
    blocker = tmp_path / "afile"
    blocker.write_text("a regular file where a directory should be")
    expect_bad(tmp_path, ["--tokenizer", "char", "--input", small_input, "--out", str(blocker / "sub" / "p")],
               "afile")


def test_missing_option_and_unknown_option(tmp_path, small_input):
    r = run("--tokenizer", "char", "--input", small_input)
    assert r.returncode == 2 and "--out" in r.stderr
    r = run("--tokenizer", "char", "--input", small_input, "--out", str(tmp_path / "x"), "--bogus", "1")
    assert r.returncode == 2 and "--bogus" in r.stderr


def test_doc_separator_needs_gpt2(tmp_path, small_input):
    expect_bad(tmp_path, ["--tokenizer", "char", "--input", small_input, "--doc-separator", "\\n\\n"], "gpt2")


def test_gpt2_missing_files_says_where_to_download(tmp_path, small_input):
    expect_bad(tmp_path, ["--tokenizer", "gpt2", "--input", small_input, "--encoder", str(tmp_path / "no.json"),
                          "--vocab-bpe", str(tmp_path / "no.bpe")],
               "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json")


def bytes_to_unicode():
    """GPT-2's printable stand-ins for the 256 byte values, in encoder.json's id order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tiny_gpt2_files(tmp_path):
    """A GPT-2-format vocabulary with a few merges (encoder.json + vocab.bpe), so the gpt2 path
    runs without OpenAI's files: 256 byte tokens, then one token per merge, then <|endoftext|>."""
    b2u = bytes_to_unicode()
    vocab = {u: i for i, u in enumerate(b2u.values())}
    merges = []
    for word in ("the", "\u0120the", "All", "\u0120speak", "Citizen"):
        cur = word[0]
        for ch in word[1:]:
            if cur + ch not in vocab:
                merges.append((cur, ch))
                vocab[cur + ch] = len(vocab)
            cur += ch
    vocab["<|endoftext|>"] = len(vocab)
    enc, bpe = tmp_path / "encoder.json", tmp_path / "vocab.bpe"
    enc.write_text(json.dumps(vocab))
    bpe.write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    return str(enc), str(bpe), len(vocab)


GPT2_TEXT = ("First Citizen:\nSpeak, the people.\n\nAll:\nSpeak, speak.\n\nFirst Citizen:\n"
             "You are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n\n")


def check_gpt2_documents(tmp_path, enc, bpe, n_vocab):
    """Each document (split at the separator, which it keeps) starts with <|endoftext|>; the ids
    decode back to the text of each split."""
    src = tmp_path / "in.txt"
    src.write_text(GPT2_TEXT)
    prefix = str(tmp_path / "g")
    r = run("--tokenizer", "gpt2", "--input", str(src), "--out", prefix, "--encoder", enc, "--vocab-bpe", bpe,
            "--doc-separator", "\\n\\n", "--val-fraction", "0.3")
    assert r.returncode == 0, r.stderr
    tokens, eot = read_tokenizer(outputs(prefix)[2])
    assert len(tokens) == n_vocab and eot == n_vocab - 1
    cut = int(len(GPT2_TEXT) * 0.7)
    for path, part in ((outputs(prefix)[0], GPT2_TEXT[:cut]), (outputs(prefix)[1], GPT2_TEXT[cut:])):
        version, ids = read_shard(path)
        assert version == 1 and ids[0] == eot
        assert ids.count(eot) == len(part.split("\n\n"))
        assert b"".join(tokens[i] for i in ids if i != eot).decode("utf-8") == part
    return prefix


def test_gpt2_tiny_vocabulary(tmp_path):
    enc, bpe, n_vocab = tiny_gpt2_files(tmp_path)
    prefix = check_gpt2_documents(tmp_path, enc, bpe, n_vocab)
    tokens, _ = read_tokenizer(outputs(prefix)[2])
    _, ids = read_shard(outputs(prefix)[0])
    assert "Citizen".encode() in [tokens[i] for i in ids], "the merges were applied"


def test_gpt2_documents_start_with_eot(tmp_path):
    check_gpt2_documents(tmp_path, GPT2_ENCODER, GPT2_VOCAB, 50257)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
