"""`train_gpt eval --per-position` (CPU): the mean loss by token position in doubling buckets,
against the same buckets computed here by hand from tests/oracle_gpt.py's float64 reference of
the checkpoint, printed and in the --json file that scripts/plot_metrics.py --positions plots."""
import json
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_interop as ti  # noqa: E402  (the CLI helpers and the tiny run)
from oracle_gpt import RefGPT  # noqa: E402
from oracle_st import read_safetensors  # noqa: E402

T = 300   # buckets 1-128, 129-256, 257-300


def test_per_position_buckets_match_a_hand_computation(tmp_path):
    cfg = json.loads(json.dumps(ti.TINY))
    cfg["model"].update(max_seq_len=T, pos_embedding="rope")
    cfg["train"].update(seq_len=T, batch_size=2, steps=3)
    cfg["log"]["dir"] = str(tmp_path / "run")
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    ti.ok(["train", "-c", str(tmp_path / "c.json"), "--device", "cpu"])
    ckpt = str(tmp_path / "run" / "ckpt_00000003")
    with open(os.path.join(ckpt, "state.json")) as f:
        rc = json.load(f)["config"]
    V = rc["model"]["vocab_size"]
    tokens = np.random.RandomState(3).randint(0, V, 4 * T + 1)   # two batches of two windows
    shard, out = str(tmp_path / "val.bin"), str(tmp_path / "pos.json")
    ti.write_shard(shard, tokens.tolist())
    text = ti.ok(["eval", "--checkpoint", ckpt, "--data", shard, "--device", "cpu", "--per-position",
                  "--json", out])

    ref = RefGPT(rc, read_safetensors(os.path.join(ckpt, "model.safetensors"))[0])
    x = torch.tensor(tokens[:4 * T].reshape(4, T)).long()
    y = torch.tensor(tokens[1:4 * T + 1].reshape(4, T)).long()
    with torch.no_grad():
        logits, _ = ref(x, y)
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1), reduction="none")
    nll = nll.view(4, T).numpy()   # (window, position)
    want = [(1, 128, nll[:, 0:128].mean()), (129, 256, nll[:, 128:256].mean()), (257, 300, nll[:, 256:].mean())]

    got = json.load(open(out))
    assert got["event"] == "eval_positions" and got["seq_len"] == T
    assert abs(got["val_loss"] - nll.mean()) < ti.LOSS_TOL
    assert [(b["first"], b["last"], b["targets"]) for b in got["per_position"]] == [
        (1, 128, 4 * 128), (129, 256, 4 * 128), (257, 300, 4 * 44)]
    for b, (first, last, loss) in zip(got["per_position"], want):
        assert abs(b["loss"] - loss) < ti.LOSS_TOL, (first, last, b["loss"], loss)
        assert f"positions {first}-{last}: loss {b['loss']:.6f}" in text

    png = str(tmp_path / "pos.png")
    r = subprocess.run([sys.executable, os.path.join(ti.ROOT, "scripts", "plot_metrics.py"), "--positions", out,
                        "-o", png], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"

    ti.expect_refusal(["eval", "--checkpoint", ckpt, "--data", shard, "--json", str(tmp_path / "x.json")],
                      ["--json FILE needs --per-position"], tmp_path)
