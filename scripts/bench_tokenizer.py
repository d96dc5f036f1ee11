#!/usr/bin/env python3
"""GPT-2 tokenizer throughput: flashgpt's C encoder (data/gpt2_bpe.c through the bpe_encode
driver) against tiktoken's "gpt2" encoding, on the same text, in the same run.

    make build/tests/tools/bpe_encode && /usr/bin/python3 scripts/bench_tokenizer.py

Both sides are timed single-threaded (tiktoken's encode_ordinary on one str; our
gpt2_bpe_encode), best of --repeat interleaved rounds, loading the vocabulary not included; the C
side also runs gpt2_bpe_encode_parallel on all cores as prepare does. Texts: tinyshakespeare and a generated mix
of code, numbers, accented and CJK text and emoji. The ids are checked equal before any number
is printed. MB/s counts UTF-8 input bytes (1 MB = 1e6 bytes).
"""
import argparse
import os
import platform
import random
import re
import struct
import subprocess
import sys
import tempfile
import time

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "data_cache")  # scripts/fetch_data.sh fills it


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def mixed_text(n_bytes, seed=0):
    rng = random.Random(seed)
    words = ["the", "model", "tokenizer", "for", "i", "in", "range", "(", ")", ":", "return",
             "x", "=", "1", "+", "2", "3.14159", "2024", "caf\u00e9", "na\u00efve", "\u00fcber",
             "\u65e5\u672c\u8a9e", "\u4e2d\u6587", "\ud55c\uad6d\uc5b4", "\U0001f600",
             "\U0001f44d\U0001f3fd", "it's", "DON'T", "--", "...", "#", "{", "}", ";",
             "\u043f\u0440\u0438\u0432\u0435\u0442", "\u03b1\u03b2\u03b3", "0xDEADBEEF"]
    seps = [" ", " ", " ", " ", "\n", "    ", "\t", ", ", ".\n\n"]
    out, size = [], 0
    while size < n_bytes:
        s = rng.choice(words) + rng.choice(seps)
        out.append(s)
        size += len(s.encode())
    return "".join(out)


def time_tiktoken(enc, text):
    t0 = time.perf_counter()
    ids = enc.encode_ordinary(text)
    return time.perf_counter() - t0, ids


def time_ours(tool, args, path, threads):
    """One encode in a fresh bpe_encode process; the time excludes loading the vocabulary."""
    out = path + ".ids"
    cmd = [tool, "--encoder", args.encoder, "--vocab", args.vocab, "--bench", "1", "--out", out,
           path]
    if threads is not None:
        cmd[1:1] = ["--threads", str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    secs = float(re.search(r"seconds: ([0-9.]+) mb", r.stdout).group(1))
    raw = open(out, "rb").read()
    return secs, list(struct.unpack("<%di" % (len(raw) // 4), raw))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--encoder", default=os.path.join(DATA, "gpt2", "encoder.json"))
    ap.add_argument("--vocab", default=os.path.join(DATA, "gpt2", "vocab.bpe"))
    ap.add_argument("--text", action="append", help="text file(s) (default: tinyshakespeare "
                    "and a generated 4 MB mix)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--tool", default=os.path.join(ROOT, "build", "tests", "tools", "bpe_encode"))
    args = ap.parse_args()
    if not os.path.exists(args.tool):
        sys.exit(f"error: {args.tool} is missing: run `make {os.path.relpath(args.tool, ROOT)}`")
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "fetch_data.sh")], check=True)

    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=args.vocab, encoder_json_file=args.encoder)
    enc = tiktoken.Encoding("gpt2_local", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
    with tempfile.TemporaryDirectory() as tmp:
        texts = []
        for path in args.text or [os.path.join(DATA, "tinyshakespeare.txt")]:
            texts.append((os.path.basename(path), open(path, "rb").read()))
        if not args.text:
            texts.append(("mixed (generated)", mixed_text(4_000_000).encode()))
        print(f"# {time.strftime('%Y-%m-%d %H:%M')} {cpu_name()}, {os.cpu_count()} cores, "
              f"load average {os.getloadavg()[0]:.1f}, tiktoken {tiktoken.__version__}, "
              f"best of {args.repeat} rounds")
        print("| text | MB | tokens | tiktoken MB/s | flashgpt MB/s (1 thread) | speed-up "
              f"| flashgpt MB/s ({os.cpu_count()} threads) |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for i, (name, data) in enumerate(texts):
            path = os.path.join(tmp, f"text{i}.txt")
            open(path, "wb").write(data)
            # Rounds interleave the three, so that load from other processes on the machine
            # falls on all of them alike; each keeps its best round.
            t_tk = t_one = t_all = float("inf")
            text = data.decode("utf-8", errors="replace")
            for _ in range(args.repeat):
                t, ids_tk = time_tiktoken(enc, text)
                t_tk = min(t_tk, t)
                t, ids_one = time_ours(args.tool, args, path, None)
                t_one = min(t_one, t)
                t, ids_all = time_ours(args.tool, args, path, 0)
                t_all = min(t_all, t)
            if not ids_tk == ids_one == ids_all:
                sys.exit(f"error: ids differ from tiktoken on {name}: fix that before timing")
            mb = len(data) / 1e6
            print(f"| {name} | {mb:.2f} | {len(ids_tk)} | {mb / t_tk:.1f} | {mb / t_one:.1f} "
                  f"| {t_tk / t_one:.2f}x | {mb / t_all:.1f} |")


if __name__ == "__main__":
    main()
