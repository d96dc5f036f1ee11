"""scripts/profile_attention.py's parts that run without a GPU or Nsight Compute: its arguments
(refused with exit 2 and a message before PyTorch is imported), its shapes, and the summaries it
reads from ncu's raw and SASS pages (here from small tables in ncu's CSV layout)."""
import argparse
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "profile_attention.py")


def load():
    spec = importlib.util.spec_from_file_location("profile_attention", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)   # imports no PyTorch: the worker does
    return mod


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_shapes():
    m = load()
    assert m.parse_shape("gpt2") == (16, 1024, 12, 64, 0.0)
    assert m.parse_shape("shakespeare_char") == (64, 256, 6, 64, 0.2)
    assert m.parse_shape("2,8192,16,128") == (2, 8192, 16, 128, None)
    for bad in ("2,8192,16", "0,1024,12,64", "2,1024,12,x", "gpt3"):
        with pytest.raises(argparse.ArgumentTypeError, match="B,N,H,D"):
            m.parse_shape(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="head size D = 48 has no flash kernel"):
        m.parse_shape("2,1024,12,48")


@pytest.mark.parametrize("args,message", [
    (["--shape", "2,1024,12"], "--shape: expected gpt2 or shakespeare_char or B,N,H,D"),
    (["--shape", "2,1024,12,48"], "head size D = 48 has no flash kernel"),
    (["--dropout", "1.5"], "--dropout"),
    (["--pass", "both"], "--pass: invalid choice"),
    (["--lib", "no/such.so"], "--lib: no such file: 'no/such.so'"),
    (["--lib", SCRIPT, "--mix", "-1"], "--mix: expected 0 or more opcodes"),
    (["--lib", SCRIPT, "--ncu", "no/such/ncu"], "--ncu: Nsight Compute's ncu is not at 'no/such/ncu'"),
])
def test_bad_arguments_exit_2(args, message):
    p = run(*args)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


# ncu --page raw --csv: a header row, a units row, then one row per kernel.
RAW = '''"ID","Kernel Name","gpu__time_duration.sum","smsp__inst_executed.sum","smsp__issue_active.avg.pct_of_peak_sustained_active","sm__warps_active.avg.pct_of_peak_sustained_active","launch__registers_per_thread","launch__block_size","launch__grid_size","smsp__pcsamp_warps_issue_stalled_wait","smsp__pcsamp_warps_issue_stalled_barrier","smsp__pcsamp_warps_issue_stalled_math_pipe_throttle","smsp__pcsamp_warps_issue_stalled_wait_not_issued"
"","","us","inst","%","%","register/thread","","","","","",""
"0","void flash_bwd_sm90_kernel<__nv_bfloat16, 64, 1, 1, 0, 64>(AttnParams, const float *, float *)","382.944000","107,530,940","40.85","15.21","168","384","1,536","600","300","100","5000"
'''

# ncu --page source --csv --print-source sass: the kernel's name, then the instruction table.
SASS = '''"Kernel Name","void flash_bwd_sm90_kernel<...>(AttnParams)",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","Thread Instructions Executed"
"0x0","      LDC R1, c[0x0][0x28]","3","100","3200"
"0x10","      IMAD.WIDE.U32 R10, R11, -0x2daee0ad, RZ","5","3000","96000"
"0x20","@!P0  IMAD R13, R13, 0x80, R8","1","1000","32000"
"0x30","      LOP3.LUT R11, R14, 0xff, RZ, 0xc0, !PT","2","2500","80000"
"0x40","      EXIT","0","0","0"
'''


def test_summarize_raw():
    m = load()
    s = m.summarize_raw(RAW)
    assert s["name"].startswith("void flash_bwd_sm90_kernel<")
    assert s["metrics"]["time us"] == pytest.approx(382.944)
    assert s["metrics"]["warp instructions"] == 107530940
    assert s["metrics"]["issue slots busy, % of active cycles"] == pytest.approx(40.85)
    assert s["metrics"]["blocks"] == 1536
    # shares of the issued-or-not samples; the _not_issued column is a subset, not counted
    assert s["stalls"] == [("wait", 0.6), ("barrier", 0.3), ("math_pipe_throttle", 0.1)]
    with pytest.raises(ValueError, match="holds no kernel"):
        m.summarize_raw(RAW.splitlines()[0] + "\n")


@pytest.mark.parametrize("unit, value, us", [("msecond", "2.05", 2050.0), ("nsecond", "950", 0.95),
                                             ("usecond", "382.9", 382.9)])
def test_time_follows_the_units_row(unit, value, us):
    # ncu writes the duration in the unit that suits its size: a 2 ms kernel reads "2.05" in msecond
    m = load()
    head, units, vals = RAW.splitlines()[:3]
    units = units.replace('"us"', f'"{unit}"', 1)
    vals = vals.replace('"382.944000"', f'"{value}"', 1)
    assert m.summarize_raw("\n".join([head, units, vals]))["metrics"]["time us"] == pytest.approx(us)
    with pytest.raises(ValueError, match="unknown unit 'furlong'"):
        m.summarize_raw("\n".join([head, units.replace(f'"{unit}"', '"furlong"', 1), vals]))


def test_opcode_mix_and_table(capsys):
    m = load()
    ops, total = m.opcode_mix(SASS, 2)
    assert ops == [("IMAD", 4000.0), ("LOP3", 2500.0)] and total == 6600.0
    with pytest.raises(ValueError, match="no SASS source table"):
        m.opcode_mix(RAW, 2)
    m.print_summary("backward, GPT-2's shape", m.summarize_raw(RAW), (ops, total))
    out = capsys.readouterr().out
    assert "| time us | 382.9 |" in out and "| warp instructions | 107,530,940 |" in out
    assert "| wait | 60.0% |" in out and "| IMAD | 4,000 | 60.6% |" in out


def test_summary_prints_the_pipe_and_memory_rows_the_report_has(capsys):
    m = load()
    m.print_summary("t", {"name": "k", "metrics": {"time us": 1.5, "L2 throughput, % of peak": 50.0},
                          "stalls": [("wait", 1.0)]}, None)
    out = capsys.readouterr().out
    assert "| L2 throughput, % of peak | 50.0 |" in out and "| time us | 1.5 |" in out
    assert "| warp instructions | - |" in out  # the always-printed rows say what is missing
    assert "DRAM" not in out and "tensor pipe" not in out
