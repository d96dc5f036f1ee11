"""scripts/ab_train.py on the CPU backend: two binaries alternately, bench and whole-run modes,
and its refusals (a missing binary or config: exit 2; a run that fails: exit 1 with its message)."""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "ab_train.py")
BIN = os.environ.get("TRAIN_GPT", os.path.join(ROOT, "train_gpt"))

TINY = {
    "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 16, "max_seq_len": 16},
    "data": {"synthetic": "markov"},
    "train": {"batch_size": 2, "seq_len": 16, "steps": 6, "seed": 3},
    "precision": {"dtype": "fp32"},
    "log": {"every": 3, "eval_every": 3, "eval_tokens": 64, "sample_every": 0, "checkpoint_every": 0},
}


def ab(*args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env=env)


def config(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def table_rows(out):
    return [l for l in out.splitlines() if re.match(r"^\| [0-9]+ \|", l)]


def test_bench_rounds_alternate_and_give_ratios(tmp_path):
    js = tmp_path / "ab.json"
    r = ab(BIN, BIN, "-c", config(tmp_path), "--device", "cpu", "--rounds", "3", "--steps", "2",
           "--json", str(js))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = table_rows(r.stdout)
    assert len(rows) == 3, r.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        a, b, ratio = int(cells[1].replace(",", "")), int(cells[2].replace(",", "")), float(cells[3])
        assert a > 0 and b > 0 and abs(ratio - b / a) < 1e-3 + 1e-3 * ratio
    m = re.search(r"B/A: median ([0-9.]+), range ([0-9.]+)-([0-9.]+)", r.stdout)
    assert m and float(m.group(2)) <= float(m.group(1)) <= float(m.group(3)), r.stdout
    rounds = json.loads(js.read_text())["rounds"]
    assert [x["round"] for x in rounds] == [1, 2, 3] and all(x["a"]["tokens_s"] > 0 for x in rounds)


def test_whole_run_reports_time_and_best_val(tmp_path):
    r = ab(BIN, BIN, "-c", config(tmp_path), "--device", "cpu", "--rounds", "2", "--whole-run")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = table_rows(r.stdout)
    assert len(rows) == 2, r.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[4]) > 0 and float(cells[5]) > 0
        # the same binary and seed on the CPU backend: the same losses
        assert re.fullmatch(r"[0-9]+\.[0-9]{4}", cells[6]) and cells[6] == cells[7], row


def test_missing_binary_or_config_exit_2(tmp_path):
    r = ab(str(tmp_path / "nope"), BIN, "-c", config(tmp_path), "--device", "cpu")
    assert r.returncode == 2 and "not an executable file" in r.stderr, r.stderr
    r = ab(BIN, BIN, "-c", str(tmp_path / "missing.json"), "--device", "cpu")
    assert r.returncode == 2 and "no such config" in r.stderr, r.stderr


def test_failing_run_exits_1_with_its_message(tmp_path):
    r = ab(BIN, BIN, "-c", config(tmp_path), "--device", "cpu", "--rounds", "1", "--steps", "1",
           "--set", "train.no_such_key=1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "exited with 2" in r.stderr and "no_such_key" in r.stderr, r.stderr
