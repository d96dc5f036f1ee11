#!/usr/bin/env python3
"""Throughput of `train_gpt prepare --tokenizer gpt2` on a large text, beside tiktoken's "gpt2"
encoding of the same text in the same run.

    /usr/bin/python3 scripts/bench_prepare.py [--mb 200] [--threads N] [--data DIR]

The text is tinyshakespeare's paragraphs in a seeded random order until --mb MB (1 MB = 1e6
bytes). prepare streams it into 100M-token shards (wall time of the whole process, its peak RSS
from the kernel); tiktoken encodes the same text with encode_ordinary on one thread, then with
encode_ordinary_batch over the paragraphs on --threads threads. MB/s counts UTF-8 input bytes.
prepare's token count is checked equal to tiktoken's whole-text count before any number is
printed (the batch, cut at paragraphs, may tokenise the joins differently: it is for speed only). --data names the directory
with tinyshakespeare.txt, encoder.json and vocab.bpe (default data_cache/ and data_cache/gpt2/,
which scripts/fetch_data.sh fills).
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def positive_int(v):
    try:
        x = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{v}'")
    if x < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{v}'")
    return x


def find(data, name, sub=""):
    for d in ([data] if data else []) + [os.path.join(ROOT, "data_cache", sub)]:
        path = os.path.join(d, name)
        if os.path.exists(path):
            return path
    sys.exit(f"bench_prepare: {name} not found (run scripts/fetch_data.sh, or pass --data DIR)")


def shard_tokens(prefix):
    d, base = os.path.split(prefix)
    total = 0
    for f in sorted(os.listdir(d)):
        if f.startswith(base + "_train_") and f.endswith(".bin"):
            total += int(np.fromfile(os.path.join(d, f), dtype=np.int32, count=3)[2])
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=positive_int, default=200, help="MB of text (default 200)")
    ap.add_argument("--threads", type=positive_int, default=os.cpu_count(), help="threads for both sides")
    ap.add_argument("--data", help="directory with tinyshakespeare.txt, encoder.json, vocab.bpe")
    ap.add_argument("--bin", default=os.path.join(ROOT, "train_gpt"))
    args = ap.parse_args()
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"bench_prepare: {args.bin} is not an executable (make builds it)")
    text = open(find(args.data, "tinyshakespeare.txt"), encoding="utf-8").read()
    encoder, vocab = find(args.data, "encoder.json", "gpt2"), find(args.data, "vocab.bpe", "gpt2")
    import tiktoken   # after the argument checks: a bad argument fails without it
    paras = [p + "\n\n" for p in text.split("\n\n") if p]
    rng = random.Random(0)
    parts, size = [], 0
    while size < args.mb * 1e6:
        p = paras[rng.randrange(len(paras))]
        parts.append(p)
        size += len(p.encode())
    big = "".join(parts)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "big.txt")
        with open(src, "w", encoding="utf-8") as f:
            f.write(big)
        prefix = os.path.join(tmp, "out", "big")
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        cmd = [args.bin, "prepare", "--tokenizer", "gpt2", "--encoder", encoder, "--vocab-bpe", vocab,
               "--input", src, "--out", prefix, "--shard-tokens", "100000000", "--val-tokens", "0"]
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(p.pid, 0)
        t_ours = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"bench_prepare: prepare failed: {p.stderr.read().decode()[-2000:]}")
        ours = shard_tokens(prefix) - 1   # less the leading end-of-text
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=vocab, encoder_json_file=encoder)   # no download
    enc = tiktoken.Encoding("gpt2_local", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
    t0 = time.perf_counter()
    ids = enc.encode_ordinary(big)
    t_one = time.perf_counter() - t0
    t0 = time.perf_counter()
    enc.encode_ordinary_batch(parts, num_threads=args.threads)
    t_many = time.perf_counter() - t0
    if len(ids) != ours:
        sys.exit(f"bench_prepare: token counts differ: prepare {ours}, tiktoken {len(ids)}")
    mb = size / 1e6
    print(f"{mb:.0f} MB of text, {len(ids):,} tokens, {args.threads} threads, {os.cpu_count()} CPUs")
    print("| what | seconds | MB/s |")
    print("| --- | --- | --- |")
    print(f"| train_gpt prepare (whole process, peak RSS {usage.ru_maxrss / 1024:.0f} MB) | {t_ours:.2f} | {mb / t_ours:.1f} |")
    print(f"| tiktoken encode_ordinary, one thread | {t_one:.2f} | {mb / t_one:.1f} |")
    print(f"| tiktoken encode_ordinary_batch, {args.threads} threads | {t_many:.2f} | {mb / t_many:.1f} |")


if __name__ == "__main__":
    main()
