"""scripts/bench_attention.py's parts that run without a GPU: its arguments (refused with exit 2
and a message before PyTorch is imported), the shapes of its speed and A/B tables (--heads,
--shapes; the defaults as they are: D 64 and 128, causal and full, B*N = 16K tokens (B at least
1), 2048 // D heads) and the printing of its tables from rows of numbers."""
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "bench_attention.py")
SEQS = [1024, 2048, 4096, 8192, 16384, 32768]   # the script's default lengths


def load():
    spec = importlib.util.spec_from_file_location("bench_attention", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)   # imports no PyTorch: that happens in main, after the arguments
    return mod


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=ROOT, timeout=60)


@pytest.mark.parametrize("args,needle", [
    (["--heads", "80"], "--heads: expected head dims among 32, 64, 96, 128, 256"),
    (["--heads", "64,"], "--heads"),
    (["--heads", ""], "--heads"),
    (["--shapes", "gpt3"], "--shapes: expected names among gpt2, shakespeare_char"),
    (["--shapes", "gpt2,,"], "--shapes"),
    (["--heads", "32,96,256", "--lib", "/nonexistent/libattention.so"], "--lib: no such file"),
])
def test_bad_arguments_exit_2(args, needle):
    r = run(*args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert needle in r.stderr, r.stderr


def test_default_shapes_are_the_d_sweep():
    m = load()
    rows = m.speed_shapes([64, 128], SEQS)
    assert [(r["D"], r["causal"], r["N"]) for r in rows] == \
        [(D, c, N) for D in (64, 128) for c in (True, False) for N in SEQS]
    for r in rows:
        assert r["B"] == max(1, 16384 // r["N"]) and r["H"] * r["D"] == 2048 and r["dropout"] == 0 and r["name"] is None


def test_heads_and_named_shapes():
    m = load()
    rows = m.speed_shapes(m.head_list("32,96,256"), [1024], m.shape_list("gpt2,shakespeare_char"))
    assert [(r["D"], r["H"], r["B"], r["N"]) for r in rows[:6]] == \
        [(32, 64, 16, 1024)] * 2 + [(96, 21, 16, 1024)] * 2 + [(256, 8, 16, 1024)] * 2
    gpt2, shakespeare = rows[6:]
    assert (gpt2["B"], gpt2["N"], gpt2["H"], gpt2["D"], gpt2["causal"], gpt2["dropout"]) == (16, 1024, 12, 64, True, 0)
    assert (shakespeare["B"], shakespeare["N"], shakespeare["H"], shakespeare["D"], shakespeare["causal"],
            shakespeare["dropout"]) == (64, 256, 6, 64, True, 0.2)
    # FlashAttention's convention: 4 B H N^2 D, halved under the causal mask.
    assert m.fwd_flops(gpt2) == 4 * 16 * 12 * 1024 * 1024 * 64 / 2
    assert m.mask_text(rows[1]) == "full" and m.mask_text(gpt2) == "causal (gpt2)"
    assert m.mask_text(shakespeare) == "causal (shakespeare_char, dropout 0.2)"
    # Feature-cost mode leaves the shape's own dropout off: A runs no feature at any row.
    bare = m.speed_shapes([64], [1024], ["shakespeare_char"], own_dropout=False)[-1]
    assert bare["dropout"] == 0.0 and (bare["B"], bare["N"], bare["H"]) == (64, 256, 6)
    assert m.mask_text(bare) == "causal (shakespeare_char)"


def test_tables_print_one_line_per_shape(capsys):
    m = load()
    shapes = m.speed_shapes([96], [2048], ["shakespeare_char"])
    speed = []
    for i, sh in enumerate(shapes):
        row = dict(sh)
        for k, name in enumerate(("ours", "flash", "eff", "cudnn")):
            row[name + "_fwd"], row[name + "_bwd"] = 100.0 + 10 * k + i, 200.0 + 10 * k + i
        speed.append(row)
    m.print_speed(speed, "bf16")
    lines = capsys.readouterr().out.splitlines()
    body = [line for line in lines if line.startswith("| ") and not line.startswith(("| D ", "| ---"))]
    assert body == ["| 96 | causal | 8 x 2048 | 21 | 100 | 110 | 120 | 130 | 0.91 | 200 | 210 | 220 | 230 | 0.95 |",
                    "| 96 | full | 8 x 2048 | 21 | 101 | 111 | 121 | 131 | 0.91 | 201 | 211 | 221 | 231 | 0.95 |",
                    "| 64 | causal (shakespeare_char, dropout 0.2) | 64 x 256 | 6 | 102 | 112 | 122 | 132 | 0.91 | 202 | "
                    "212 | 222 | 232 | 0.95 |"]
    ab = []
    for sh in shapes:
        row = dict(sh)
        for pas in ("fwd", "bwd"):
            row[pas] = {"tflops_a": 100.0, "tflops_b": 110.0, "b_over_a": 1.1, "b_over_a_min": 1.05,
                        "b_over_a_max": 1.15}
        ab.append(row)
    m.print_ab(ab, "a.so", "b.so", 3, 10)
    lines = capsys.readouterr().out.splitlines()
    assert "| 64 | causal (shakespeare_char, dropout 0.2) | 64 x 256 | 6 | 100 | 110 | 1.100 | 1.050-1.150 | " \
           "100 | 110 | 1.100 | 1.050-1.150 |" in lines, lines
    assert sum(line.startswith("| 96 |") for line in lines) == 2
