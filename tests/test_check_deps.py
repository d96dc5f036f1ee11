"""make check-deps: scripts/check_deps.py accepts the tree as it is and refuses each kind of
broken include in a copy of it (a forbidden layer edge, a header under "never", a path not
written from the root, a source file no row covers)."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "check_deps.py")


def run(root):
    return subprocess.run(["/usr/bin/python3", SCRIPT, "--root", str(root)], capture_output=True, text=True)


@pytest.fixture()
def tree(tmp_path):
    """A git repository holding the sources and docs/ARCHITECTURE.md of this checkout."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for f in files:
        if f.endswith((".c", ".h", ".cu", ".cuh")) or f == "docs/ARCHITECTURE.md":
            os.makedirs(tmp_path / os.path.dirname(f), exist_ok=True)
            shutil.copy(os.path.join(ROOT, f), tmp_path / f)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    return tmp_path


def plant(tree, path, line):
    with open(tree / path, "a") as f:
        f.write(line + "\n")
    subprocess.run(["git", "add", "-A"], cwd=tree, check=True)


def test_current_tree_passes():
    r = run(ROOT)
    assert r.returncode == 0, r.stderr
    assert "includes follow docs/ARCHITECTURE.md" in r.stdout


@pytest.mark.parametrize("path, line, words", [
    ("optim/adamw.c", '#include "model/gpt.h"', ["optim may not include", "model/gpt.h"]),
    ("model/gpt.c", '#include "trainer/train_step.h"', ["model may not include"]),
    ("model/gpt.c", '#include "model/cpu/ops_cpu.h"', ["model may not include", "model/cpu/ops_cpu.h"]),
    ("attention/mask.c", '#include "common/config.h"', ["attention may not include", "common/config.h"]),
    ("trainer/train_step.c", '#include "optim/optim_cuda.h"', ["trainer may not include"]),
    ("data/shard.c", '#include "shard.h"', ["not a path from the repository root"]),
])
def test_broken_include_is_refused(tree, path, line, words):
    plant(tree, path, line)
    r = run(tree)
    assert r.returncode == 1
    for w in words:
        assert w in r.stderr, r.stderr
    assert "1 broken include(s)" in r.stderr


def test_uncovered_file_is_refused(tree):
    os.makedirs(tree / "extra")
    (tree / "extra" / "x.c").write_text('#include "common/check.h"\n')
    subprocess.run(["git", "add", "-A"], cwd=tree, check=True)
    r = run(tree)
    assert r.returncode == 1 and "extra/x.c: no row" in r.stderr


def test_missing_table_exits_2(tree):
    (tree / "docs" / "ARCHITECTURE.md").write_text("# Architecture\n\nno rules here\n")
    r = run(tree)
    assert r.returncode == 2 and "Who may include whom" in r.stderr
