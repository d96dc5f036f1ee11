"""The commands that README.md and docs/*.md show, read out of their Markdown.

A command is a line (lines ending in a backslash joined, the trailing comment cut) of
- a fenced code block tagged sh, bash, shell or console: every line;
- any other code block, fenced or indented by four spaces: a line that starts (after VAR=value
  assignments) with a program: one of PROGRAMS or a path to one (./train_gpt, scripts/x.sh,
  /usr/bin/time); the other lines are output, trees and the like;
- an inline code span that starts with a path to a program or with python3 or bash (`train_gpt
  bench` or `make test` in a sentence name a subcommand or a target, and are not commands).
"""
import dataclasses
import glob
import os
import re
import shlex

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
SHELL_TAGS = {"sh", "bash", "shell", "console"}
# Programs a command line in an untagged or indented code block may start with (by bare name).
PROGRAMS = {"train_gpt", "python3", "bash", "sh", "make", "mpirun", "torchrun", "sbatch", "srun", "for",
            "git", "pip", "pip3", "cd", "source", "cp", "ln", "curl", "nvidia-smi", "ncu", "nsys"}
INLINE_PROGRAMS = {"python3", "bash", "sh"}


@dataclasses.dataclass
class DocCommand:
    text: str         # as the doc writes it, comment cut, continuation lines joined
    places: list      # "FILE:LINE" of each place it appears

    def where(self):
        return ", ".join(self.places)


def cut_comment(line):
    """line without its trailing shell comment (a # outside quotes, at a word's start)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def first_program(line):
    """The program a shell line starts with (after VAR=value assignments), or None."""
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    for w in words:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w):
            return w
    return None


def is_program_path(word):
    return bool(re.match(r"^(\.{1,2}/|/)?([\w.-]+/)+[\w.-]+$", word)) and (
        word.startswith(("./", "/")) or word.endswith((".sh", ".py")) or os.path.basename(word) == "train_gpt")


def logical_lines(numbered):
    """(line number, text) of the shell lines of a code block: continuations joined, comments cut."""
    out, start, parts = [], None, []
    for n, line in numbered:
        if start is None:
            start = n
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1].strip())
            continue
        parts.append(line.strip())
        text = cut_comment(" ".join(p for p in parts if p))
        if text:
            out.append((start, text))
        start, parts = None, []
    return out


def code_blocks(lines):
    """(tag, [(line number, line)]) of each code block of a Markdown file: fenced (tag: the info
    string's first word, "" if none) or indented by four spaces (tag None). A four-space line in
    a list item continues the item, as CommonMark reads it."""
    blocks, fence, block = [], None, []
    prev_blank, in_list, indented = True, False, None
    for n, line in enumerate(lines, 1):
        if fence:
            if line.strip().startswith(fence[0]):
                blocks.append((fence[1], block))
                fence = None
            else:
                block.append((n, line))
            continue
        m = re.match(r"^ {0,3}(```+|~~~+)\s*([\w-]*)", line)
        if m:
            if indented:
                blocks.append((None, indented))
                indented = None
            fence, block = (m.group(1), m.group(2)), []
            prev_blank = False
            continue
        blank = not line.strip()
        if indented is not None:
            if blank or line.startswith("    "):
                indented.append((n, line[4:]))
                prev_blank = blank
                continue
            blocks.append((None, [(k, t) for k, t in indented if t.strip()]))
            indented = None
        if line.startswith("    ") and not blank and prev_blank and not in_list:
            indented = [(n, line[4:])]
        elif not blank and not line.startswith(" "):
            in_list = bool(re.match(r"^([-*+]|\d+[.)])\s", line))
        prev_blank = blank
    if indented:
        blocks.append((None, [(k, t) for k, t in indented if t.strip()]))
    return blocks


def inline_spans(lines):
    """(line number, text) of each inline code span outside code blocks (a span may wrap lines)."""
    fenced = set()
    for _, block in code_blocks(lines):
        fenced.update(n for n, _ in block)
    text = "\n".join("" if n in fenced or re.match(r"^ {0,3}(```|~~~)", line) else line
                     for n, line in enumerate(lines, 1))
    out = []
    for para in re.finditer(r"(?:[^\n]+\n?)+", text):   # spans never cross a blank line
        for m in re.finditer(r"(`+)(.+?)\1", para.group(0), re.S):
            n = text.count("\n", 0, para.start() + m.start()) + 1
            out.append((n, " ".join(m.group(2).split())))
    return out


def commands_of(path, lines):
    rel = os.path.relpath(path, ROOT)
    found = []
    for tag, block in code_blocks(lines):
        for n, text in logical_lines(block):
            prog = first_program(text)
            if tag in SHELL_TAGS or (prog is not None and (prog in PROGRAMS or is_program_path(prog))):
                found.append((f"{rel}:{n}", text))
    for n, text in inline_spans(lines):
        prog = first_program(text)
        if prog is not None and (prog in INLINE_PROGRAMS or is_program_path(prog)) and len(text.split()) > 1:
            found.append((f"{rel}:{n}", text))
    return found


def doc_commands():
    """Every command of the docs, once each, in the order of DOCS and of the lines."""
    seen = {}
    for path in DOCS:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for place, text in sorted(commands_of(path, lines), key=lambda p: int(p[0].rsplit(":", 1)[1])):
            seen.setdefault(text, DocCommand(text, [])).places.append(place)
    return list(seen.values())


def repo_files(text):
    """The files of the checkout a command names (configs/..., scripts/..., tests/..., docs/...)."""
    return re.findall(r"(?<![\w./$-])((?:configs|scripts|tests|docs)/[\w.-]+(?:/[\w.-]+)*)(?![\w*?\[])", text)
