"""Every command that README.md and docs/*.md show keeps working. The commands are read out of the
Markdown (tests/doc_commands.py says which lines count), so one added to the docs is tested
without anyone editing this file.

Each command matches exactly one entry of RUN (it runs here, with the overrides the entry names)
or of NOT_RUN (it does not, for the reason given); a command that matches none fails, and so does
an entry that matches no command. Every command's files of the checkout (configs/, scripts/, ...)
must exist; a command of NOT_RUN must give only options its program's --help lists.

The commands of RUN run in a clone of the checkout: every tracked top-level entry linked into a
temporary directory, with ./train_gpt and build/ linked, and data_cache/ a directory of its own
holding links to the tests' data files and the char-level tinyshakespeare that
scripts/prepare_shakespeare.sh makes. Each runs within its entry's time bound, in the
environment of EXTRA_ENV, and must exit 0, leave the files the entry names and print what it
names. A command that reads another one's output names it in `after`, and that one runs first.
The `make` of a doc command works on the same build/ as the tests (make passes its variables
down in MAKEFLAGS), so it finds everything built and does nothing.
"""
import dataclasses
import gzip
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys

import pytest

import data_files
import launch
from doc_commands import commands_of, doc_commands, repo_files

ROOT = data_files.ROOT

# Smaller runs of the doc's training commands: a 1-layer model of width 32 on 2 x 32 tokens.
TINY_MODEL = ("--set model.n_layer=1 --set model.n_embd=32 --set train.batch_size=2 --set train.seq_len=32"
              " --set log.eval_tokens=2048")
TINY_RUN = TINY_MODEL + " --set train.steps=20"


def tiny_run(log_dir):
    return f"{TINY_RUN} --set log.dir={log_dir}"


# Inputs that commands read, made in the clone (each takes the clone's path).
def shakespeare_as_input_txt(box):
    """input.txt: the text README.md's prepare reads."""
    os.symlink(os.path.join("data_cache", "tinyshakespeare.txt"), os.path.join(box, "input.txt"))


def _paragraphs(box):
    with open(os.path.join(box, "data_cache", "tinyshakespeare.txt"), encoding="utf-8") as f:
        return [p for p in f.read().split("\n\n") if p.strip()]


def jsonl_gz_corpus(box):
    """corpus/part_0.jsonl.gz, corpus/part_1.jsonl.gz: tinyshakespeare's paragraphs as JSONL
    documents with the text in the field "text", alternately in two gzip files."""
    os.makedirs(os.path.join(box, "corpus"), exist_ok=True)
    paras = _paragraphs(box)
    for i in range(2):
        with gzip.open(os.path.join(box, "corpus", f"part_{i}.jsonl.gz"), "wt", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": p}) + "\n" for p in paras[i::2])


def jsonl_train(box):
    """train.jsonl: tinyshakespeare's paragraphs as JSONL (what docs/formats.md's pyarrow line makes)."""
    with open(os.path.join(box, "train.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": p}) + "\n" for p in _paragraphs(box))


def second_run(box):
    """runs/other: a copy of runs/try, for the plot of two runs."""
    shutil.copytree(os.path.join(box, "runs", "try"), os.path.join(box, "runs", "other"), dirs_exist_ok=True)


def flat_data_dir(box):
    """bench_data/: tinyshakespeare.txt, encoder.json and vocab.bpe in one directory (--data DIR)."""
    d = os.path.join(box, "bench_data")
    os.makedirs(d, exist_ok=True)
    for src in (data_files.SHAKESPEARE, data_files.GPT2_ENCODER, data_files.GPT2_VOCAB):
        dst = os.path.join(d, os.path.basename(src))
        if not os.path.lexists(dst):
            os.symlink(src, dst)


@dataclasses.dataclass
class Run:
    """A doc command run here: `pattern` is searched in the command as the doc writes it; `subs`
    (regex, replacement) pairs then `append` make it small; `before` makes its inputs; `after`
    names (by pattern) the doc commands whose output it reads; `creates` lists files it must
    leave and `prints` a regex its standard output must match; `timeout` bounds its wall time
    in seconds."""
    pattern: str
    subs: tuple = ()
    append: str = ""
    before: tuple = ()
    after: tuple = ()
    creates: tuple = ()
    prints: str = ""
    timeout: int = 60


README_TRAIN = r"^\./train_gpt train -c configs/tiny_cpu\.json --set train\.steps=200 --set log\.dir=runs/try$"

RUN = [
    Run(r"^bash scripts/quickstart\.sh$", append=TINY_RUN, creates=("runs/tiny_cpu/ckpt_00000020",), timeout=180),
    Run(r"^make$"),
    Run(r"^\./train_gpt prepare --tokenizer char --input input\.txt --out data_cache/mydata/mydata$",
        before=(shakespeare_as_input_txt,),
        creates=("data_cache/mydata/mydata_train.bin", "data_cache/mydata/mydata_val.bin")),
    Run(r"^\./train_gpt prepare --tokenizer gpt2 --input corpus/\*\.jsonl\.gz --jsonl-field text ",
        subs=((r"--val-tokens 1000000\b", "--val-tokens 10000"),), before=(jsonl_gz_corpus,),
        creates=("data_cache/web/web_train_000000.bin", "data_cache/web/web_val_000000.bin")),
    Run(README_TRAIN, append=TINY_MODEL, creates=("runs/try/ckpt_00000200", "runs/try/metrics.jsonl")),
    Run(r"^\./train_gpt train --help$", prints=r"\n  model\.n_layer +integer"),
    Run(r"^\./train_gpt eval --checkpoint runs/try/ckpt_00000200 --data ", prints=r"(?m)^val_loss: [0-9.]+$",
        after=(README_TRAIN, r"^\./train_gpt prepare --tokenizer char --input input\.txt ")),
    Run(r"^\./train_gpt sample --checkpoint runs/try/ckpt_00000200 ", prints=r"ROMEO:", after=(README_TRAIN,)),
    Run(r"^\./train_gpt export --checkpoint runs/try/ckpt_00000200 --format hf --out hf_model$",
        after=(README_TRAIN,), creates=("hf_model/config.json", "hf_model/model.safetensors")),
    Run(r"^make libattention$", creates=("build/libattention.so",)),
    Run(r"^\./train_gpt bench -c configs/tiny_cpu\.json --steps 5 --breakdown$", append=TINY_MODEL,
        prints=r"[0-9.]+ ms/step, [0-9]+ tokens/s"),
    Run(r"^\./train_gpt bench -c configs/gpt2_124m\.json --steps 20 --attention$",
        subs=((r"--steps 20", "--steps 1"),), append="--set train.batch_size=1 --set train.seq_len=128",
        prints=r"(?m)^bench attention: "),
    Run(r"^python3 scripts/plot_metrics\.py runs/try runs/other -o compare\.png$", before=(second_run,),
        after=(README_TRAIN,), creates=("compare.png",)),
    Run(r"^mpirun -np 2 \./train_gpt train -c configs/tiny_cpu\.json --device cpu$",
        append=tiny_run("runs/mpi_dp"), creates=("runs/mpi_dp/ckpt_00000020",)),
    Run(r"^mpirun -np 2 \./train_gpt train -c configs/tiny_cpu\.json --device cpu --set dist\.context_parallel=2$",
        append=tiny_run("runs/mpi_cp"), creates=("runs/mpi_cp/ckpt_00000020",)),
    Run(r"^mpirun -np 4 \./train_gpt train -c configs/tiny_cpu\.json --device cpu --set dist\.context_parallel=2$",
        append=tiny_run("runs/mpi_dp_cp"), creates=("runs/mpi_dp_cp/ckpt_00000020",), timeout=120),
    Run(r"^bash scripts/fetch_data\.sh$"),
    Run(r"^bash scripts/prepare_shakespeare\.sh char$",
        creates=("data_cache/shakespeare_char/shakespeare_char_train.bin",)),
    Run(r"^\./train_gpt train -c configs/tiny_cpu\.json$", append=tiny_run("runs/tiny_cpu_doc"),
        creates=("runs/tiny_cpu_doc/ckpt_00000020",)),
    Run(r"^\./train_gpt train -c configs/shakespeare_char\.json --device cpu --set train\.steps=1 ",
        append="--set log.dir=runs/shakespeare_cpu", after=(r"^bash scripts/prepare_shakespeare\.sh char$",),
        creates=("runs/shakespeare_cpu/ckpt_00000001/state.json",)),
    Run(r"^OMP_WAIT_POLICY=passive /usr/bin/python3 scripts/bench_cpu_train\.py --steps 10 --threads 2$",
        subs=((r"--steps 10", "--steps 1"),), prints=r"ratio flashgpt / PyTorch: [0-9.]+x", timeout=120),
    Run(r"^make build/tests/tools/bpe_encode && /usr/bin/python3 scripts/bench_tokenizer\.py$", append="--repeat 1",
        timeout=120),
    Run(r"^/usr/bin/python3 scripts/bench_tokenizer\.py$", append="--repeat 1", timeout=120),
    Run(r"""^python3 -c "open\('a1m\.txt', 'w'\)\.write\('a' \* 1000000\)"$""", creates=("a1m.txt",)),
    Run(r"^python3 scripts/bench_prepare\.py --mb 200 --data DIR$", before=(flat_data_dir,),
        subs=((r"--mb 200", "--mb 2"), (r"--data DIR", "--data bench_data")), timeout=120),
    Run(r"^train_gpt prepare --tokenizer gpt2 --input train\.jsonl --jsonl-field text --out data_cache/fw/fw ",
        subs=((r"--val-tokens 100000000\b", "--val-tokens 10000"),), before=(jsonl_train,),
        creates=("data_cache/fw/fw_train_000000.bin", "data_cache/fw/fw_val_000000.bin")),
]

GPU = "needs a GPU"
NOT_RUN = [
    (r"^bash scripts/setup\.sh && make test$",
     "runs the whole test suite, this test among them (scripts/setup.sh runs here in scripts/quickstart.sh)"),
    (r"^torchrun --nproc_per_node=2 ", "needs 2 GPUs (NCCL)"),
    (r"^torchrun --nproc_per_node=8 ", "needs 8 GPUs (NCCL)"),
    (r"^mpirun -np 2 \./train_gpt train -c configs/gpt2_124m\.json$", "needs 2 GPUs (NCCL)"),
    (r"^sbatch ", "needs a Slurm cluster"),
    (r"--device cuda\b", f"{GPU} (--device cuda)"),
    (r"^make libattention build/tests/gpu/test_attention_gpu$",
     "builds the GPU attention test and libattention.so for the GPU commands beside it (make test compiles "
     "every CUDA source of the library already)"),
    (r"^scripts/run_gpu_attention\.sh ", f"{GPU} (nvidia-smi, the GPU attention test, compute-sanitizer)"),
    (r'^(SANITIZE_TOOLS="[^"]*" )?bash scripts/gpu_sanitize\.sh ', f"{GPU} (compute-sanitizer over the GPU tests)"),
    (r"^(python3 )?scripts/bench_attention\.py\b", f"{GPU} (the CUDA kernels through libattention.so)"),
    (r"^(PYTHONPATH=\S+ )?python3 scripts/bench_flash_attn_func\.py\b",
     f"{GPU} (CUDA tensors through the Python package)"),
    (r"^export PYTHONPATH=", "a shell setting for the reader's session, not a command (the Python tests set "
     "PYTHONPATH themselves)"),
    (r"^python3 scripts/bench_train\.py\b", f"{GPU} (train_gpt and PyTorch on CUDA)"),
    (r"^python3 scripts/ab_train\.py OLD/", f"{GPU} (two train_gpt builds on CUDA; tests/test_ab_train.py runs "
     "the script on the CPU backend)"),
    (r"^(python3 )?scripts/bench_decode\.py\b", f"{GPU} (the split-KV decode kernel, train_gpt sample and SDPA on CUDA)"),
    (r"^(python3 )?scripts/profile_(kernels|attention)\.py\b", f"{GPU} and Nsight Compute (ncu)"),
    (r"^python3 scripts/sass_stats\.py\b", "needs nvdisasm, which the CUDA toolkit here lacks (pip's "
     "nvidia-cuda-nvdisasm has it); tests/test_sass_stats.py runs the script with stand-in tools"),
    (r"^for i in 1 2 3; do for b in OLD/train_gpt \./train_gpt; do \$b bench -c configs/gpt2_124m\.json \$B; ",
     f"{GPU} ($B, set on the line before, holds --device cuda)"),
    (r"^python3 scripts/long_context_table\.py\b", f"{GPU} (--device cuda by default)"),
    (r"^scripts/long_(copy|retrieval)_proof\.sh \d+", f"{GPU} (trains configs/long_retrieval_4k.json's model in bf16)"),
    (r"^python3 scripts/bench_dist\.py\b", "needs 2 GPUs (NCCL under torchrun)"),
    (r"^bash scripts/device_deps\.sh$", "downloads Debian packages into .deps/, for building on a GPU machine "
                                        "without them"),
    (r"^train_gpt prepare --tokenizer gpt2\|char\|byte --input INPUT ", "a usage synopsis, not a command"),
    (r"^python3 -c \"import json, pyarrow\.parquet as pq;",
     "needs pyarrow, which is not among the dependencies scripts/setup.sh installs"),
    (r"^source scripts/device_env\.sh && make -j16 test-gpu-sanitize ",
     f"{GPU} (compute-sanitizer over the GPU tests)"),
    (r"^\./train_gpt eval --checkpoint runs/long/ckpt_00010000 --passkey ",
     "needs a long-context checkpoint (runs/long/) that no command of the docs trains; "
     "tests/test_eval_passkey.py runs eval --passkey end to end"),
    (r"^(bash )?tests/fuzz/run\.sh build/fuzz ", "needs make fuzz's libFuzzer builds (clang): CI runs make fuzz-run "
                                              "after make test"),
]

# The environment of every command, beside the test's own (launch.env: no launcher variables,
# OMP_NUM_THREADS=1, mpirun allowed as root): python3 is the interpreter running the tests (Debian's,
# with torch, numpy and matplotlib) and train_gpt is on PATH (docs/formats.md writes its bare name);
# OpenMP threads wait passively (a shared 2-core box); mpirun may start more ranks than cores.
EXTRA_ENV = {"OMP_WAIT_POLICY": "passive", "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def classify(cmd):
    """(the Run entry or None, the reason not run or None); fails unless exactly one entry matches."""
    runs = [r for r in RUN if re.search(r.pattern, cmd.text)]
    skips = [(p, why) for p, why in NOT_RUN if re.search(p, cmd.text)]
    n = len(runs) + len(skips)
    if n == 0:
        pytest.fail(f"{cmd.where()}: the doc command `{cmd.text}` is in neither table of {__file__}: add it to RUN "
                    f"(with overrides that make it small) or to NOT_RUN (with the reason)")
    if n > 1:
        pytest.fail(f"{cmd.where()}: the doc command `{cmd.text}` matches {n} entries "
                    f"({[r.pattern for r in runs] + [p for p, _ in skips]}): make the patterns tell them apart")
    return (runs[0], None) if runs else (None, skips[0][1])


def made_small(entry, text):
    for pat, rep in entry.subs:
        new = re.sub(pat, rep, text)
        assert new != text, f"override {pat!r} -> {rep!r} no longer applies to `{text}`"
        text = new
    return f"{text} {entry.append}" if entry.append else text


def long_options(args):
    return [a.split("=")[0] for a in args if a.startswith("--") and a != "--"]


def lists(help_text, option):
    return re.search(re.escape(option) + r"(?![\w-])", help_text) is not None


def tail(s, n=3000):
    return s if len(s) <= n else "..." + s[-n:]


class Clone:
    """The temporary copy of the checkout the commands run in, and which commands ran there."""

    def __init__(self, box):
        self.box = str(box)
        self.done = {}   # doc command text -> None when it ran as documented, else what went wrong
        r = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, f"git ls-files in {ROOT} failed (the test links the tracked files): {r.stderr}"
        for top in sorted({p.split("/")[0] for p in r.stdout.split("\n") if p}):
            os.symlink(os.path.join(ROOT, top), os.path.join(self.box, top))
        os.symlink(launch.BIN, os.path.join(self.box, "train_gpt"))
        os.symlink(os.path.join(ROOT, "build"), os.path.join(self.box, "build"))
        os.makedirs(os.path.join(self.box, "data_cache", "gpt2"))
        for src in (data_files.SHAKESPEARE, data_files.GPT2_ENCODER, data_files.GPT2_VOCAB):
            os.symlink(src, os.path.join(self.box, "data_cache", os.path.relpath(src, data_files.DATA)))
        bindir = os.path.join(self.box, ".bin")
        os.makedirs(bindir)
        os.symlink(sys.executable, os.path.join(bindir, "python3"))
        os.symlink(launch.BIN, os.path.join(bindir, "train_gpt"))
        self.env = launch.env(**EXTRA_ENV, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
        self.helps = {}  # help command -> its output

    def help_of(self, args):
        line = shlex.join(args + ["--help"])
        if line not in self.helps:
            rc, out, err = self.shell(line, 60)
            if rc != 0:
                pytest.fail(f"`{line}` (in {self.box}) exited with {rc}:\n{tail(err)}", pytrace=False)
            self.helps[line] = out
        return self.helps[line]

    def unknown_options(self, text):
        """The options (--name, --set keys) a command not run here gives its program (train_gpt or a
        Python script) that the program's --help does not list; pipelines, loops and commands
        with variables are left out."""
        if re.search(r"&&|\||;|\$", text):
            return []
        words = shlex.split(text)
        for i, w in enumerate(words):
            if os.path.basename(w) == "train_gpt" and i + 1 < len(words) and not words[i + 1].startswith("-"):
                args, help_text = words[i + 2:], self.help_of(["./train_gpt", words[i + 1]])
                keys_help = self.help_of(["./train_gpt", "train"])
                keys = [a.split("=")[0] for k, a in zip(args, args[1:]) if k == "--set"]
                return ([o for o in long_options(args) if not lists(help_text, o)] +
                        [f"--set {k}" for k in keys if not re.search(rf"(?m)^  {re.escape(k)} ", keys_help)])
            if w.endswith(".py"):
                help_text = self.help_of(["python3", w])
                return [o for o in long_options(words[i + 1:]) if not lists(help_text, o)]
        return []

    def shell(self, line, timeout):
        """(exit code or None on timeout, stdout, stderr) of bash running line in the clone."""
        p = subprocess.Popen(["bash", "-o", "pipefail", "-c", line], cwd=self.box, env=self.env, text=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout)
            return p.returncode, out, err
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            return None, out, err

    def run(self, cmd, entry):
        """None when cmd ran as its entry says, else a message naming the doc place and the failure."""
        if cmd.text in self.done:
            return self.done[cmd.text]
        self.done[cmd.text] = problem = self._run(cmd, entry)
        return problem

    def _run(self, cmd, entry):
        head = f"{cmd.where()}: `{cmd.text}`"
        for pattern in entry.after:
            deps = [c for c in COMMANDS if re.search(pattern, c.text)]
            if len(deps) != 1:
                return f"{head}: its entry's `after` pattern {pattern!r} matches {len(deps)} doc commands, not 1"
            dep_entry, why = classify(deps[0])
            problem = self.run(deps[0], dep_entry) if dep_entry else f"it is not run: {why}"
            if problem:
                return f"{head}: reads the output of `{deps[0].text}`, which failed:\n{problem}"
        for make in entry.before:
            make(self.box)
        line = made_small(entry, cmd.text)
        rc, out, err = self.shell(line, entry.timeout)
        ran = f"{head}\n  ran as `{line}` in {self.box}"
        if rc is None:
            return f"{ran}\n  took longer than {entry.timeout} s\n--- stdout\n{tail(out)}\n--- stderr\n{tail(err)}"
        if rc != 0:
            return f"{ran}\n  exited with {rc}, not 0\n--- stdout\n{tail(out)}\n--- stderr\n{tail(err)}"
        missing = [f for f in entry.creates if not os.path.exists(os.path.join(self.box, f))]
        if missing:
            return f"{ran}\n  exited 0 but did not write {', '.join(missing)}\n--- stdout\n{tail(out)}"
        if not re.search(entry.prints, out):
            return f"{ran}\n  exited 0 but printed nothing that matches {entry.prints!r}\n--- stdout\n{tail(out)}"
        return None


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    c = Clone(tmp_path_factory.mktemp("doc_commands"))
    # the tiny_cpu.json runs read char-level tinyshakespeare, as a user's clone would have it
    rc, out, err = c.shell("bash scripts/prepare_shakespeare.sh char", 60)
    assert rc == 0, f"scripts/prepare_shakespeare.sh char failed in {c.box}:\n{out}\n{err}"
    return c


COMMANDS = doc_commands()


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.places[0] for c in COMMANDS])
def test_doc_command(clone, cmd):
    """Classified; the checkout's files it names exist; when in RUN, it runs; when in NOT_RUN, its
    program's --help lists the options it gives."""
    entry, _ = classify(cmd)
    missing = [f for f in repo_files(cmd.text) if not os.path.exists(os.path.join(ROOT, f))]
    assert not missing, f"{cmd.where()}: `{cmd.text}` names {', '.join(missing)}, which the checkout does not have"
    if entry is not None:
        problem = clone.run(cmd, entry)
        if problem:
            pytest.fail(problem, pytrace=False)
    else:
        unknown = clone.unknown_options(cmd.text)
        assert not unknown, (f"{cmd.where()}: `{cmd.text}` gives {', '.join(unknown)}, which its program's --help "
                             f"does not list")


def test_every_entry_matches_a_doc_command():
    texts = [c.text for c in COMMANDS]
    stale = [p for p in [r.pattern for r in RUN] + [p for p, _ in NOT_RUN] if not any(re.search(p, t) for t in texts)]
    assert not stale, f"entries of {__file__} that match no command of the docs any more (remove them): {stale}"


def test_the_docs_show_commands_of_each_kind():
    """The extraction finds the commands it is meant to (a Markdown change that hid them all from
    it would otherwise pass unnoticed)."""
    by_place = {p.split(":")[0] for c in COMMANDS for p in c.places}
    assert {"README.md", "docs/PERFORMANCE.md", "docs/distributed.md", "docs/formats.md"} <= by_place, by_place
    assert len([c for c in COMMANDS if classify(c)[0]]) >= 15


SAMPLE = """# title

Text with `python3 scripts/x.py --a 1` inline, `train_gpt bench` (a name), and `make test`,
and one that wraps: `./train_gpt eval
--checkpoint D`.

```sh
./train_gpt train -c c.json \\
  --set a=1   # comment
cp "a # b" c
```

```
tree/     a layout line
./train_gpt bench -c x.json
eval step 1 | val loss 2.0
```

    OMP_WAIT_POLICY=passive /usr/bin/python3 scripts/bench.py --steps 10

- a list item

    four spaces here continue the item
"""


def test_extraction_reads_every_kind_of_block():
    found = commands_of(os.path.join(ROOT, "SAMPLE.md"), SAMPLE.split("\n"))
    assert found == [("SAMPLE.md:8", "./train_gpt train -c c.json --set a=1"),
                     ("SAMPLE.md:10", 'cp "a # b" c'),
                     ("SAMPLE.md:15", "./train_gpt bench -c x.json"),
                     ("SAMPLE.md:19", "OMP_WAIT_POLICY=passive /usr/bin/python3 scripts/bench.py --steps 10"),
                     ("SAMPLE.md:3", "python3 scripts/x.py --a 1"),
                     ("SAMPLE.md:4", "./train_gpt eval --checkpoint D")], found
