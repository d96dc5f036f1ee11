"""`train_gpt eval --passkey` (CPU) end to end: tiny checkpoints with a byte, a char and a GPT-2
vocabulary answer the passkey test; the printed grid (a row per length, a column per depth) and
the --json file agree and have the shape asked for, every accuracy is a whole number of trials,
the default lengths are those of train.seq_len / 4, / 2 and seq_len that hold the prompt, and bad
values are refused with a message naming the option (exit 2, no file left behind). Where the key
sits in the prompt is checked exactly by tests/test_passkey.c."""
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data_files  # noqa: E402,F401  (GPT-2's BPE files in data_cache/, which the GPT-2 case encodes with)
import test_interop as ti  # noqa: E402  (the CLI helpers)

TEXTS = ("A pass key is hidden in this text. Find it and remember it.\n"
         "The grass is green. The sky is blue. The sun is warm. Here we go again.\n"
         "The pass key is . Remember it.  is the pass key.\nWhat is the pass key? The pass key is 0123456789")


def write_tokenizer(path, tokens, eot=None):
    """llm.c's tokenizer file (version 2) with the given token byte strings."""
    header = struct.pack("<256I", *([20240328, 2, len(tokens), 0xFFFFFFFF if eot is None else eot] + [0] * 252))
    with open(path, "wb") as f:
        f.write(header + b"".join(bytes([len(t)]) + t for t in tokens))


def train(tmp_path, name, tokens, T, eot=None, layers=2, embd=32):
    tok = tmp_path / f"{name}_tok.bin"
    write_tokenizer(tok, tokens, eot)
    cfg = {"model": {"n_layer": layers, "n_head": 2, "n_embd": embd, "vocab_size": len(tokens), "max_seq_len": T},
           "data": {"synthetic": "markov", "tokenizer": str(tok)},
           "train": {"batch_size": 2, "seq_len": T, "steps": 2, "seed": 3},
           "precision": {"dtype": "fp32"},
           "log": {"dir": str(tmp_path / name), "every": 10, "sample_every": 0}}
    (tmp_path / f"{name}.json").write_text(json.dumps(cfg))
    # Its samples are random bytes: read as bytes.
    r = subprocess.run([ti.BIN, "train", "-c", str(tmp_path / f"{name}.json"), "--device", "cpu"],
                       capture_output=True, cwd=ti.ROOT, timeout=300, env=ti.ENV)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return str(tmp_path / name / "ckpt_00000002")


def grid(stdout):
    """The printed grid: {length: [accuracy per depth]} and the depths of the header."""
    lines = stdout.splitlines()
    head = next(i for i, l in enumerate(lines) if l.split()[:1] == ["length"])
    depths = [float(x) for x in lines[head].split()[1:]]
    rows = {}
    for line in lines[head + 1:]:
        if line.startswith("passkey_accuracy:"):
            break
        length, *acc = line.split()
        rows[int(length)] = [float(a) for a in acc]
    return depths, rows


def check_json(path, lengths, depths, trials, rows):
    got = json.load(open(path))
    assert got["event"] == "eval_passkey" and got["trials"] == trials and got["digits"] == 5
    assert got["lengths"] == lengths and got["depths"] == depths
    assert len(got["accuracy"]) == len(lengths) and all(len(r) == len(depths) for r in got["accuracy"])
    for length, row in zip(lengths, got["accuracy"]):
        assert all(abs(a * trials - round(a * trials)) < 1e-9 and 0 <= a <= 1 for a in row)
        assert [round(a, 2) for a in row] == rows[length]
    cells = [a for r in got["accuracy"] for a in r]
    assert abs(got["mean_accuracy"] - sum(cells) / len(cells)) < 1e-12


def test_passkey_grid_byte_vocabulary(tmp_path):
    ckpt = train(tmp_path, "byte", [bytes([i]) for i in range(256)], 256)
    out = str(tmp_path / "pk.json")
    text = ti.ok(["eval", "--checkpoint", ckpt, "--device", "cpu", "--passkey", "--passkey-lengths", "256,180",
                  "--passkey-trials", "2", "--seed", "5", "--json", out])
    depths, rows = grid(text)
    assert depths == [0, 0.25, 0.5, 0.75, 1] and list(rows) == [256, 180]   # in the order asked for
    check_json(out, [256, 180], [0, 0.25, 0.5, 0.75, 1], 2, rows)
    assert "2 trials" in text and "passkey_accuracy:" in text

    # Defaults: seq_len 256 / 4 and / 2 cannot hold the byte prompt (about 160 tokens): 256 alone.
    text = ti.ok(["eval", "--checkpoint", ckpt, "--device", "cpu", "--passkey", "--passkey-depths", "0,1",
                  "--passkey-trials", "1", "--json", out])
    depths, rows = grid(text)
    assert depths == [0, 1] and sorted(rows) == [256]
    check_json(out, [256], [0, 1], 1, rows)

    pk = ["eval", "--checkpoint", ckpt, "--device", "cpu", "--passkey"]
    ti.expect_refusal(pk + ["--passkey-lengths", "300", "--json", str(tmp_path / "x" / "no.json")],
                      ["--passkey-lengths: 300 is longer than the model's max_seq_len 256"], tmp_path)
    ti.expect_refusal(pk + ["--passkey-lengths", "256,100"], ["--passkey-lengths: 100 tokens cannot hold the passkey "
                                                             "prompt, which needs at least"], tmp_path)
    ti.expect_refusal(pk + ["--passkey-depths", "0,1.5"], ["--passkey-depths: expected a number in [0, 1], got '1.5'"],
                      tmp_path)
    ti.expect_refusal(pk + ["--passkey-depths", "0,,"], ["--passkey-depths"], tmp_path)
    ti.expect_refusal(pk + ["--passkey-trials", "0"], ["--passkey-trials: expected an integer"], tmp_path)
    ti.expect_refusal(pk + ["--passkey-lengths", "abc"], ["--passkey-lengths: expected an integer"], tmp_path)
    ti.expect_refusal(pk + ["--data", "x.bin"], ["--passkey builds its own prompts: drop --data"], tmp_path)
    ti.expect_refusal(["eval", "--checkpoint", ckpt, "--passkey-depths", "0.5"], ["--passkey-depths needs --passkey"],
                      tmp_path)


def test_passkey_char_vocabulary_and_its_missing_characters(tmp_path):
    chars = sorted(set(TEXTS))
    ckpt = train(tmp_path, "char", [c.encode() for c in chars], 200, layers=1)
    text = ti.ok(["eval", "--checkpoint", ckpt, "--device", "cpu", "--passkey", "--passkey-lengths", "200",
                  "--passkey-depths", "0.5", "--passkey-trials", "3"])
    depths, rows = grid(text)
    assert depths == [0.5] and list(rows) == [200] and rows[200][0] in (0, 0.33, 0.67, 1)
    lacking = train(tmp_path, "lacking", [c.encode() for c in chars if c != "W"], 200, layers=1)
    ti.expect_refusal(["eval", "--checkpoint", lacking, "--device", "cpu", "--passkey"],
                      ["cannot encode \"What is the pass key?"], tmp_path)


def test_passkey_gpt2_vocabulary_and_a_checkpoint_without_tokenizer(tmp_path):
    # A GPT-2 sized vocabulary ending in <|endoftext|> 50256: the texts go through GPT-2's BPE.
    ckpt = train(tmp_path, "gpt2", [bytes([1 + i % 255]) for i in range(50257)], 64, eot=50256, layers=1, embd=16)
    out = str(tmp_path / "g.json")
    text = ti.ok(["eval", "--checkpoint", ckpt, "--device", "cpu", "--passkey", "--passkey-lengths", "48,64",
                  "--passkey-depths", "0.5,1", "--passkey-trials", "2", "--json", out])
    depths, rows = grid(text)
    check_json(out, [48, 64], [0.5, 1], 2, rows)
    bare = ti.train_tiny(tmp_path, "bare")
    ti.expect_refusal(["eval", "--checkpoint", bare, "--device", "cpu", "--passkey"], ["needs a tokenizer"], tmp_path)
