#!/usr/bin/env python3
"""The static instruction mix of a CUDA file's kernels, without a GPU: compiled to a cubin with the
Makefile's NVCCFLAGS (read from the tree's own Makefile), disassembled by nvdisasm, counted per kernel.

usage: python3 scripts/sass_stats.py FILE.cu [FILE.cu ...] [--kernel REGEX] [--ops HGMMA,R2UR,...]
           [--base REV] [--arch sm_90a] [--nvcc PATH] [--nvdisasm PATH]

For each kernel whose (demangled, where c++filt is found) name matches REGEX, one table row: its
instructions, those of its wgmma span (from its first HGMMA to its last, where the main loops of
the sm90 kernels lie) and, for each opcode of --ops, how many of the span's instructions have it
(predicates and modifiers cut: `@!P0 IMAD.MOV.U32` counts as IMAD). With --base REV the same files
are also built from git revision REV (`git archive`, so its whole tree) and each cell reads
"REV's -> the working tree's". Counts are static: an instruction in a loop counts once, so they
point at what a change removed from a loop, not at its time (Nsight Compute measures that:
scripts/profile_attention.py).

nvdisasm is not in every CUDA toolkit install; pip has it: `python3 -m pip download --no-deps
--only-binary=:all: nvidia-cuda-nvdisasm`, then unzip the wheel and pass its bin/nvdisasm. Exit
status 2 for bad arguments or a missing tool, 1 when a build or the disassembly fails.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Prints the Makefile's NVCCFLAGS (read beside the Makefile: `make -f Makefile -f -`).
PRINT_FLAGS = "sass-stats-nvccflags:\n\t@echo $(NVCCFLAGS)\n"
FUNC = re.compile(r"^\s*\.text\.(\S+):")
INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def parse_sass(text):
    """{kernel: [opcode, ...]} in program order from `nvdisasm -c` output."""
    kernels, cur = {}, None
    for line in text.splitlines():
        m = FUNC.match(line)
        if m:
            cur = kernels.setdefault(m.group(1), [])
            continue
        m = INSN.search(line)
        if m and cur is not None:
            cur.append(m.group(1))
    return kernels


def stats(ops, wanted):
    """(instructions, wgmma span's instructions, {opcode: count in the span}); a kernel without
    HGMMA has an empty span."""
    hg = [i for i, op in enumerate(ops) if op == "HGMMA"]
    span = ops[hg[0]:hg[-1] + 1] if hg else []
    return len(ops), len(span), {w: span.count(w) for w in wanted}


def demangle(names):
    """The names as c++filt writes them without their parameter lists (`void k<float, 64>`), or as
    they are without c++filt."""
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    if len(out) != len(names):
        return {n: n for n in names}
    return {n: d.split("(")[0] if d != n else n for n, d in zip(names, out)}


def nvcc_flags(tree, nvcc):
    """The NVCCFLAGS of `tree`'s Makefile, its CUDA_ARCH left out (the caller names one)."""
    p = subprocess.run(["make", "-s", "--no-print-directory", "-C", tree, "-f", "Makefile", "-f", "-", f"NVCC={nvcc}",
                        "CUDA_ARCH=", "sass-stats-nvccflags"], input=PRINT_FLAGS, capture_output=True, text=True)
    if p.returncode != 0 or not p.stdout.strip():
        sys.stderr.write(p.stderr[-3000:])
        sys.exit(f"sass_stats.py: could not read NVCCFLAGS from {tree}/Makefile")
    return p.stdout.split()


def build(tree, files, args, tmp):
    """{kernel: opcodes} of the files compiled in `tree` (with its Makefile's flags)."""
    kernels, flags = {}, nvcc_flags(tree, args.nvcc)
    for i, f in enumerate(files):
        cubin = os.path.join(tmp, f"{i}.cubin")
        cmd = [args.nvcc, *flags, "-cubin", f"-gencode=arch=compute_{args.arch[3:]},code={args.arch}", f, "-o", cubin]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=tree)
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-3000:])
            sys.exit(f"sass_stats.py: nvcc failed on {f} (exit status {p.returncode})")
        p = subprocess.run([args.nvdisasm, "-c", cubin], capture_output=True, text=True)
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-3000:])
            sys.exit(f"sass_stats.py: nvdisasm failed on {f}'s cubin (exit status {p.returncode})")
        kernels.update(parse_sass(p.stdout))
    return kernels


def numbers(ops, wanted):
    """A kernel's table cells: its instructions, its span's and the span's count of each opcode."""
    n, s, c = stats(ops, wanted)
    return [n, s] + [c[w] for w in wanted]


def table(now, base, pattern, wanted):
    """The markdown table's lines: a row per matching kernel of `now` (base: {} or REV's)."""
    names = demangle(sorted(now))
    head = ["kernel", "instructions", "wgmma span"] + wanted
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for k in sorted(now, key=lambda k: names[k]):
        if not pattern.search(names[k]):
            continue
        cells = numbers(now[k], wanted)
        if base:
            cells = ([f"{a} -> {b}" for a, b in zip(numbers(base[k], wanted), cells)] if k in base
                     else [f"(new) {x}" for x in cells])
        lines.append("| " + " | ".join([names[k]] + [str(x) for x in cells]) + " |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", metavar="FILE.cu", help="CUDA files, relative to the repository's root")
    ap.add_argument("--kernel", default=".", help="regular expression on the kernels' names (default: all)")
    ap.add_argument("--ops", default="HGMMA,R2UR,IMAD,UIADD3,MUFU,LDL,STL", help="opcodes counted in the wgmma span")
    ap.add_argument("--base", metavar="REV", help="also build the files from this git revision and compare")
    ap.add_argument("--arch", default="sm_90a", help="sm_XX[a] to compile for (default sm_90a)")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--nvdisasm", default=shutil.which("nvdisasm") or "/usr/local/cuda/bin/nvdisasm")
    args = ap.parse_args()
    for f in args.files:
        if not os.path.isfile(os.path.join(ROOT, f)):
            ap.error(f"no such file in the repository: '{f}'")
    try:
        pattern = re.compile(args.kernel)
    except re.error as e:
        ap.error(f"--kernel: not a regular expression: {e}")
    wanted = [w.strip() for w in args.ops.split(",") if w.strip()]
    if not wanted or not all(re.fullmatch(r"[A-Z][A-Z0-9_]*", w) for w in wanted):
        ap.error(f"--ops: expected comma-separated SASS opcodes such as HGMMA,IMAD, got '{args.ops}'")
    if not re.fullmatch(r"sm_\d+a?", args.arch):
        ap.error(f"--arch: expected sm_XX or sm_XXa (sm_90a), got '{args.arch}'")
    for tool, name in ((args.nvcc, "--nvcc"), (args.nvdisasm, "--nvdisasm")):
        if not (os.path.isfile(tool) and os.access(tool, os.X_OK)):
            hint = " (pip has it: see this script's help)" if name == "--nvdisasm" else ""
            ap.error(f"{name}: no executable at '{tool}'{hint}")
    if args.base and subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", "--quiet", args.base + "^{commit}"],
                                    capture_output=True).returncode != 0:
        ap.error(f"--base: '{args.base}' is not a commit of this repository")
    with tempfile.TemporaryDirectory() as tmp:
        base = {}
        if args.base:
            tree = os.path.join(tmp, "base")
            os.makedirs(tree)
            arch = subprocess.run(["git", "-C", ROOT, "archive", args.base], capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", tree], input=arch, check=True)
            missing = [f for f in args.files if not os.path.isfile(os.path.join(tree, f))]
            if missing:
                print(f"sass_stats.py: {args.base} has no {', '.join(missing)}", file=sys.stderr)
                return 2
            base = build(tree, args.files, args, tmp)
        now = build(ROOT, args.files, args, tmp)
    lines = table(now, base, pattern, wanted)
    if len(lines) == 2:
        print(f"sass_stats.py: no kernel of {', '.join(args.files)} matches --kernel '{args.kernel}'", file=sys.stderr)
        return 2
    print(f"static SASS ({args.arch}); opcode columns count the wgmma span"
          + (f"; {args.base} -> working tree" if args.base else ""))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
