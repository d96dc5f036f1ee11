"""Oracle test: data/gpt2_bpe.c against tiktoken's "gpt2" encoding, token for token.

tiktoken's encoding is built from the same two local files as ours (no download): the merges and
vocabulary through tiktoken.load.data_gym_to_mergeable_bpe_ranks, the pattern from
tiktoken_ext.openai_public, <|endoftext|> = 50256. Our side runs through the bpe_encode driver
(build/tests/tools/bpe_encode, built by `make test`).

Invalid UTF-8 is defined (data/gpt2_bpe.h) as Python's bytes.decode('utf-8', errors='replace'),
so for any bytes the expected ids are tiktoken's encode_ordinary of that decoded string.
"""
import array
import os
import random
import struct
import subprocess
import sys

import pytest

try:
    import tiktoken
except ImportError as e:   # the oracle is required, not optional: fail loudly
    raise ImportError("tiktoken is missing: /usr/bin/python3 -m pip install "
                      "--break-system-packages tiktoken (scripts/setup.sh does this)") from e
from tiktoken.load import data_gym_to_mergeable_bpe_ranks  # noqa: E402
from tiktoken_ext.openai_public import r50k_pat_str  # noqa: E402

from data_files import GPT2_ENCODER as ENCODER, GPT2_VOCAB as VOCAB, SHAKESPEARE  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, os.environ.get("BUILD", "build"), "tests", "tools", "bpe_encode")


@pytest.fixture(scope="module")
def enc():
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=VOCAB, encoder_json_file=ENCODER)
    return tiktoken.Encoding("gpt2_local", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


@pytest.fixture(scope="module")
def tool():
    assert os.path.exists(TOOL), f"{TOOL} is missing: build it with `make test` (or make {TOOL})"
    return TOOL


def run_tool(tool, *args):
    r = subprocess.run([tool, "--encoder", ENCODER, "--vocab", VOCAB, *args],
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout.decode()


def encode_cases(tool, tmp_path, cases, threads=None):
    """Encodes each byte string on its own; returns one list of ids per case."""
    path, out = tmp_path / "cases.bin", tmp_path / "ids.bin"
    path.write_bytes(b"".join(struct.pack("<I", len(c)) + c for c in cases))
    extra = ["--threads", str(threads)] if threads is not None else []
    run_tool(tool, "--cases", "--out", str(out), *extra, str(path))
    ids, raw, pos = [], out.read_bytes(), 0
    while pos < len(raw):   # records: uint32 count, then count int32 ids
        (count,) = struct.unpack_from("<I", raw, pos)
        ids.append(list(array.array("i", raw[pos + 4:pos + 4 + 4 * count])))
        pos += 4 + 4 * count
    assert len(ids) == len(cases)
    return ids


def expected(enc, data):
    return enc.encode_ordinary(data.decode("utf-8", errors="replace"))


def assert_cases_match(enc, tool, tmp_path, cases, threads=None):
    ours = encode_cases(tool, tmp_path, cases, threads)
    bad = [(c, o, expected(enc, c)) for c, o in zip(cases, ours) if o != expected(enc, c)]
    assert not bad, "%d of %d cases differ; first: %r ours %s tiktoken %s" % (
        len(bad), len(cases), bad[0][0][:200], bad[0][1][:40], bad[0][2][:40])


CONTRACTIONS = ["it's", "I'm", "we'll", "they've", "you're", "he'd", "don't", "IT'S", "I'M",
                "WE'LL", "THEY'VE", "YOU'RE", "HE'D", "DON'T", "'s'", "''s", "'", "'''", " 's",
                "'S", " 'S", "rock'n'roll", "it\u2019s", "'s's's", "x'" + "s" * 3, "'ll've're",
                "1's", "?'s", " 'll", "''", "' '", "'t'"]
DIGITS = ["123", "3.14159", "1,000,000", " 2024", "x1y2z3", "007", "\u0663\u0664\u0665",
          "\u216b", "\u00bd", "x\u00b2", "12 34", "  42", "1e-9", "0x1F", "\uff11\uff12",
          "\U0001d7d8\U0001d7d9", " \u0663"]
PUNCT = ["!!!???", "...", "--", " ...", "<|endoftext|>", "@#$%^&*()", "```python", "=>", "://",
         " !", "a!b", "\u00bf?\u00a1!", "\u2014\u2013", "\u3002\u3001", "#!/bin/sh", "\u00a7\u00b6",
         "~~~~", "(((x)))", "<|endoftext|>hi<|endoftext|>"]
SPACES = ["   ", "\t\t", "\n\n\n", " \n ", "a  b", "a   b", "a \t b", "\r\n", "  \n\n  x",
          "x   ", "   x", "\u00a0", "a\u00a0b", "\u3000x", "a\u2028b", "\x85", "a\x85b", "\x85\x85x",
          "\x0b\x0c", "\t\tx", " \t\nx", "x\n \n", "\n", " ", "\t", "\r", "a \u00a0 b",
          "\u2000\u200a\u202f\u205f", "\u200b", "\u180e", "\ufeffx", "x \n\ny"]
LETTERS = ["caf\u00e9", "na\u00efve", "\u00c5ngstr\u00f6m", "\u00c9COLE", "cafe\u0301",
           "\u00df\u1e9e", "\u0130stanbul", "\u03b1\u03b2\u03b3 \u0391\u0392\u0393",
           "\u043f\u0440\u0438\u0432\u0435\u0442", "\u05e9\u05dc\u05d5\u05dd",
           "\u0645\u0631\u062d\u0628\u0627", "\u0928\u092e\u0938\u094d\u0924\u0947",
           "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35"]
CJK = ["\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\u4e2d\u6587\u6d4b\u8bd5",
       "\ud55c\uad6d\uc5b4", " \u4e2d\u6587", "\u4e2d1\u6587", "\U00020000\U0002a6d6"]
FOUR_BYTE = ["\U0001f600", "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467",
             "\U0001f1eb\U0001f1f7", "\U0001d518\U0001d52b\U0001d526", "\U00010348", "\U00013000",
             " \U0001f600\U0001f600", "a\U0001f600b", "\U0001f600 ", "\U0010fffd", "\U000e0041"]
COMBINING = ["e\u0301\u0302", "\u0301", " \u0301", "a\u20dd", "Z\u0324\u0354\u0367\u0311\u0313",
             "\u0915\u093f", "1\u0301", "!\u0301", "\u3099", "\u0301\u0301\u0301x"]
INVALID = [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"abc\xe2\x82",
           b"\xe2\x82abc", b"\x80\x80", b"\xf0\x9f\x98", b"a\xf5b", b"\xe0\x80\xaf", b"\xc2",
           b" \xff\xfe ", b"it\xe2\x80s", b"\xf0\x9f\x98\x80\xf0\x9f", b"\xc1\xbf", b"\xf8\x88\x80\x80\x80",
           b"x\xed\xbf\xbfy", b"\xf0\x8f\xbf\xbf", b"\xe1\x80\xe2\x82\xac", b"\n\xff\n"]
LONG = ["a" * 5000, "9" * 3000, "!" * 3000, " " * 3000, "\n" * 2000, "\U0001f600" * 500,
        "\u4e2d" * 1000, "ab" * 2000, "x " * 2000, "'s" * 1000, "a\u0301" * 800,
        " " * 500 + "x", "1" * 129 + "a" * 129]


def random_text(rng, pieces, n):
    return "".join(rng.choice(pieces) for _ in range(n))


def test_tinyshakespeare(enc, tool, tmp_path):
    out = tmp_path / "ids.bin"
    decoded = tmp_path / "decoded.txt"
    run_tool(tool, "--out", str(out), "--decoded", str(decoded), SHAKESPEARE)
    ours = list(struct.unpack("<%di" % (out.stat().st_size // 4), out.read_bytes()))
    data = open(SHAKESPEARE, "rb").read()
    assert ours == expected(enc, data)
    assert decoded.read_bytes() == data   # decode(encode(x)) == x for valid UTF-8


@pytest.mark.parametrize("group", ["CONTRACTIONS", "DIGITS", "PUNCT", "SPACES", "LETTERS", "CJK",
                                   "FOUR_BYTE", "COMBINING", "LONG"])
def test_stress_group(enc, tool, tmp_path, group):
    strings = globals()[group]
    # each string alone, and each between neighbours that could join it or split it
    contexts = ["{}", " {}", "x{}", "{}x", "1{}2", "a {} b", "\n{}\n", "'{}'", "a  {}b", "{}  "]
    cases = [c.format(s).encode() for s in strings for c in contexts]
    assert_cases_match(enc, tool, tmp_path, cases)


def test_invalid_utf8(enc, tool, tmp_path):
    contexts = [b"%s", b" %s", b"x%sx", b"1%s2", b"%s%s", b"\xf0\x9f%s\x98\x80"]
    cases = [c.replace(b"%s", s) for s in INVALID for c in contexts]
    assert_cases_match(enc, tool, tmp_path, cases)
    # the replaced text is what comes back from the ids
    data = b"ok \xff\xc0\x80 \xf0\x9f\x98 end"
    src, decoded = tmp_path / "bad.txt", tmp_path / "decoded.txt"
    src.write_bytes(data)
    run_tool(tool, "--decoded", str(decoded), str(src))
    assert decoded.read_bytes() == data.decode("utf-8", errors="replace").encode()


def test_random_mixtures(enc, tool, tmp_path):
    rng = random.Random(1234)
    pool = (CONTRACTIONS + DIGITS + PUNCT + SPACES + LETTERS + CJK + FOUR_BYTE + COMBINING
            + list("abc XYZ'\t\n.,;!?0123456789"))
    cases = [random_text(rng, pool, rng.randint(1, 60)).encode() for _ in range(400)]
    invalid_pool = [s for s in INVALID] + [s.encode() for s in pool]
    cases += [b"".join(rng.choice(invalid_pool) for _ in range(rng.randint(1, 30)))
              for _ in range(200)]
    cases += [bytes(rng.randrange(256) for _ in range(rng.randint(1, 200))) for _ in range(200)]
    assert_cases_match(enc, tool, tmp_path, cases)


def test_every_code_point(enc, tool, tmp_path):
    # "x{c}1{c} {c}" and "a  {c}b" show whether c is a letter, a number, whitespace or none of these
    # (all that the pre-tokenizer asks of it) wherever a merge can cross c's edges; a category
    # difference that no merge can see does not change the ids. One case per 4096 code points
    # locates a difference. Planes 4-13 (never assigned so far) and 15-16 (private use) are the
    # same kind of character throughout: every 61st of those is enough.
    cases = []
    for lo in range(0, 0x110000, 4096):
        step = 61 if 0x40000 <= lo < 0xE0000 or lo >= 0xF0000 else 1
        cps = [cp for cp in range(lo, lo + 4096, step) if not 0xD800 <= cp < 0xE000]
        cases.append("".join("x%s1%s %s\na  %sb\n" % ((chr(cp),) * 4) for cp in cps).encode())
    ours = encode_cases(tool, tmp_path, [c for c in cases if c])
    bad = [hex(i * 4096) for i, (c, o) in enumerate(zip(cases, ours)) if o != expected(enc, c)]
    assert not bad, "code point blocks that differ: " + ", ".join(bad)


def test_parallel_equals_single(enc, tool, tmp_path):
    rng = random.Random(99)
    pool = ["word", " word", "\n", "\n\n", " \n", "\n ", "x\ny", ".\n", "\n'", "'s\n", "\t\n",
            "1\n2", "\u4e2d\n", "\n\u4e2d", "  ", "\U0001f600\n"] + CONTRACTIONS + LETTERS
    text = (random_text(rng, pool, 250000).encode() + b"\xff\n" + open(SHAKESPEARE, "rb").read())
    src, single, par = tmp_path / "big.txt", tmp_path / "single.bin", tmp_path / "par.bin"
    src.write_bytes(text)
    run_tool(tool, "--out", str(single), str(src))
    run_tool(tool, "--out", str(par), "--threads", "2", str(src))
    assert par.read_bytes() == single.read_bytes()
    ours = list(struct.unpack("<%di" % (single.stat().st_size // 4), single.read_bytes()))
    assert ours == expected(enc, text)


def test_bad_files_exit_2(tool, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello")
    broken = tmp_path / "encoder.json"
    broken.write_bytes(open(ENCODER, "rb").read()[:5000])
    for enc_path, vocab_path, bad in [(str(tmp_path / "missing.json"), VOCAB, "missing.json"),
                                      (str(broken), VOCAB, "malformed JSON")]:
        r = subprocess.run([tool, "--encoder", enc_path, "--vocab", vocab_path, str(text)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and bad in r.stderr, r.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
