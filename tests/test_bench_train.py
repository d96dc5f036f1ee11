"""scripts/bench_train.py's PyTorch rows run in processes of their own (torch_row): a row whose
process fails becomes a FAIL row with the failure's last line, and the script goes on. Here the
worker fails before it needs a GPU (a config that does not exist)."""
import argparse
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "bench_train.py")


def load():
    spec = importlib.util.spec_from_file_location("bench_train", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)   # imports no PyTorch: bench_torch does, in the worker
    return mod


def test_failing_torch_row_is_a_fail_row():
    m = load()
    args = argparse.Namespace(config="configs/no_such_config.json", batch=2, seq=64, steps=1)
    for mode in (None, "reduce-overhead"):
        r = m.torch_row(args, mode)
        assert r["status"] == "FAIL", r
        assert "no_such_config.json" in r["why"] and "No such file" in r["why"], r["why"]
        assert "--torch-row" in r["cmd"] and ("eager" if mode is None else mode) in r["cmd"]
