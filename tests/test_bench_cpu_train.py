"""scripts/bench_cpu_train.py runs end to end with tiny step counts: its PyTorch side builds the
oracle model from the config as train_gpt resolves it (every key's default included), so a key
that the oracle starts to read cannot break the script again."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "bench_cpu_train.py")


def bench(*args):
    env = dict(os.environ, OMP_WAIT_POLICY="passive")   # spinning workers starve a shared box
    r = subprocess.run([sys.executable, SCRIPT, "--steps", "1", "--threads", "1", *args], capture_output=True,
                       text=True, cwd=ROOT, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| flashgpt cpu (fp32) |" in r.stdout and "| PyTorch cpu (fp32, eager) |" in r.stdout, r.stdout
    ratio = float(r.stdout.split("ratio flashgpt / PyTorch:")[1].strip().rstrip("x"))
    assert ratio > 0
    return r.stdout


def test_default_config():
    assert "config configs/tiny_cpu.json, 1 threads, 1 timed steps" in bench()


def test_config_with_rope_gqa_and_window(tmp_path):
    cfg = {"model": {"n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32, "vocab_size": 64, "max_seq_len": 32,
                     "pos_embedding": "rope"},
           "attention": {"window": 8, "window_every": 2},
           "data": {"synthetic": "copy"},   # bench times random tokens, but a config names its data
           "train": {"batch_size": 2, "seq_len": 32, "steps": 10},
           "precision": {"dtype": "fp32"}}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    bench("-c", str(path))
