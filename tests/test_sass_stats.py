"""scripts/sass_stats.py without a GPU, nvcc or nvdisasm: its parser and counts on a small listing in
nvdisasm's layout, its arguments (refused with exit 2 and a message), and a whole run with stand-in
tools (an nvcc that writes an empty cubin, an nvdisasm that prints the listing), also against a
git revision."""
import importlib.util
import os
import stat
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "sass_stats.py")
CU = "attention/flash_bwd_sm90.cu"

# nvdisasm -c: a section per kernel, one instruction per line behind its address.
LISTING = """\t.text._Z6kernelv:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   IMAD.MOV.U32 R2, RZ, RZ, 0x1 ;
        /*0020*/                   R2UR UR4, R2 ;
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0040*/              @!P0 IMAD R3, R2, 0x2, RZ ;
        /*0050*/                   MUFU.EX2 R4, R3 ;
        /*0060*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0070*/                   EXIT ;
\t.text._Z5plainv:
        /*0000*/                   IMAD R1, R1, R1, RZ ;
        /*0010*/                   EXIT ;
"""


def load():
    spec = importlib.util.spec_from_file_location("sass_stats", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_parse_and_count():
    m = load()
    k = m.parse_sass(LISTING)
    assert sorted(k) == ["_Z5plainv", "_Z6kernelv"]
    assert k["_Z6kernelv"] == ["LDC", "IMAD", "R2UR", "HGMMA", "IMAD", "MUFU", "HGMMA", "EXIT"]
    # the span runs from the first HGMMA to the last, both counted; the predicated IMAD counts
    assert m.stats(k["_Z6kernelv"], ["HGMMA", "IMAD", "R2UR"]) == (8, 4, {"HGMMA": 2, "IMAD": 1, "R2UR": 0})
    assert m.stats(k["_Z5plainv"], ["IMAD"]) == (2, 0, {"IMAD": 0})


def test_table_compares_with_the_base():
    m = load()
    now = m.parse_sass(LISTING)
    base = {"_Z6kernelv": ["R2UR", "HGMMA", "R2UR", "IMAD", "HGMMA"]}
    lines = m.table(now, base, m.re.compile("kernel"), ["R2UR", "IMAD"])
    assert len(lines) == 3  # header, rule, the one matching kernel
    assert lines[2].endswith("| 5 -> 8 | 4 -> 4 | 1 -> 0 | 1 -> 1 |")
    lines = m.table(now, {}, m.re.compile("plain"), ["IMAD"])
    assert lines[2].endswith("| 2 | 0 | 0 |")


def fake_tools(tmp_path):
    """An nvcc that writes its -o file and an nvdisasm that prints LISTING."""
    nvcc, dis, listing = tmp_path / "nvcc", tmp_path / "nvdisasm", tmp_path / "listing.txt"
    listing.write_text(LISTING)
    nvcc.write_text('#!/bin/sh\nwhile [ "$#" -gt 0 ]; do [ "$1" = -o ] && : > "$2"; shift; done\n')
    dis.write_text(f'#!/bin/sh\ncat "{listing}"\n')
    for f in (nvcc, dis):
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    return str(nvcc), str(dis)


def test_whole_run_with_stand_in_tools(tmp_path):
    nvcc, dis = fake_tools(tmp_path)
    p = run(CU, "--kernel", "kernel", "--ops", "HGMMA,MUFU", "--nvcc", nvcc, "--nvdisasm", dis)
    assert p.returncode == 0, p.stderr
    assert "| HGMMA | MUFU |" in p.stdout
    assert p.stdout.rstrip().endswith("| 8 | 4 | 2 | 1 |")
    p = run(CU, "--kernel", "kernel", "--ops", "IMAD", "--base", "HEAD", "--nvcc", nvcc, "--nvdisasm", dis)
    assert p.returncode == 0, p.stderr
    assert "HEAD -> working tree" in p.stdout
    assert p.stdout.rstrip().endswith("| 8 -> 8 | 4 -> 4 | 1 -> 1 |")


@pytest.mark.parametrize("args,message", [
    (["no/such.cu"], "no such file in the repository: 'no/such.cu'"),
    ([CU, "--kernel", "("], "--kernel: not a regular expression"),
    ([CU, "--ops", "imad"], "--ops: expected comma-separated SASS opcodes"),
    ([CU, "--arch", "90"], "--arch: expected sm_XX or sm_XXa"),
    ([CU, "--nvcc", "no/such/nvcc"], "--nvcc: no executable at 'no/such/nvcc'"),
    ([CU, "--nvcc", sys.executable, "--nvdisasm", "no/such/nvdisasm"], "pip has it"),
])
def test_bad_arguments_exit_2(args, message):
    p = run(*args)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_bad_base_and_no_match_exit_2(tmp_path):
    nvcc, dis = fake_tools(tmp_path)
    p = run(CU, "--base", "no-such-revision", "--nvcc", nvcc, "--nvdisasm", dis)
    assert p.returncode == 2 and "--base: 'no-such-revision' is not a commit" in p.stderr, p.stderr
    p = run(CU, "--kernel", "nothing_like_this", "--nvcc", nvcc, "--nvdisasm", dis)
    assert p.returncode == 2 and "matches --kernel 'nothing_like_this'" in p.stderr, p.stderr
