"""End-to-end tests of ./train_gpt on the CPU backend: bad input gives exit code 2 with a message
and no output files; training shows a falling loss and writes its logs; resume is exact; a crash
during a checkpoint write never damages an older checkpoint; eval and sample work from a
checkpoint alone."""
import json
import os
import re
import resource
import signal
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("TRAIN_GPT", os.path.join(ROOT, "train_gpt"))  # make test-asan: its build

TINY = {
    "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 16, "max_seq_len": 32},
    "data": {"synthetic": "markov"},
    "train": {"batch_size": 4, "seq_len": 32, "steps": 40, "seed": 7},
    "optim": {"lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 5},
    "precision": {"dtype": "fp32"},
    "log": {"every": 10, "eval_every": 20, "eval_tokens": 512, "sample_every": 0, "sample_tokens": 20,
            "checkpoint_every": 10, "keep_checkpoints": 3},
}


def run(args, **kw):
    return subprocess.run([BIN] + args, capture_output=True, text=True, cwd=kw.pop("cwd", ROOT), timeout=300, **kw)


def write_config(tmp_path, cfg, name="cfg.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return str(p)


def tiny(tmp_path, **log):
    cfg = json.loads(json.dumps(TINY))
    cfg["log"]["dir"] = str(tmp_path / "run")
    cfg["log"].update(log)
    return cfg


def train_events(run_dir, event="train"):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [e for e in map(json.loads, f) if e["event"] == event]


# ---------------------------------------------------------------------------------------------
# bad input: exit code 2, one message naming the problem, nothing written

BAD_CONFIGS = [
    ('{"model": {"n_layer": 2,,}}', "malformed JSON"),
    ('{"model": {"n_layr": 2}}', "model.n_layr"),
    ('{"model": {"n_layer": "two"}}', "model.n_layer"),
    ('{"optim": {"lr": 50}}', "optim.lr"),
    ('{"model": {"n_embd": 30, "n_head": 4}, "data": {"synthetic": "copy"}}', "divisible"),
    ('{"train": {"seq_len": 4096}, "data": {"synthetic": "copy"}}', "max_seq_len"),
    ('{"attention": {"impl": "fast"}}', "attention.impl"),
    ('{"train": {"cuda_graph": "maybe"}}', "train.cuda_graph"),
]


@pytest.mark.parametrize("text,needle", BAD_CONFIGS)
def test_bad_config_exits_2_and_writes_nothing(tmp_path, text, needle):
    cfg = tmp_path / "bad.json"
    cfg.write_text(text)
    r = run(["train", "-c", str(cfg), "--set", f"log.dir={tmp_path}/run"])
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "error:" in r.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args,needle", [
    (["train", "-c", "/nonexistent/cfg.json"], "/nonexistent/cfg.json"),
    (["train"], "-c CONFIG.json"),
    (["train", "-c", "configs/tiny_cpu.json", "--set", "train.steps"], "key=value"),
    (["train", "-c", "configs/tiny_cpu.json", "--set", "train.nope=1"], "train.nope"),
    (["train", "-c", "configs/tiny_cpu.json", "--set"], "needs a value"),
    (["train", "-c", "configs/tiny_cpu.json", "--bogus"], "--bogus"),
    (["frobnicate"], "frobnicate"),
    (["eval", "--checkpoint", "/nonexistent"], "--data"),
    (["sample", "--checkpoint", "/nonexistent/ckpt"], "/nonexistent/ckpt"),
    (["sample", "--checkpoint", "x", "--temperature", "hot"], "--temperature"),
    (["train", "-c", "configs/tiny_cpu.json", "--device", "tpu"], "--device"),
])
def test_bad_cli_exits_2(args, needle):
    r = run(args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr


def test_cuda_graph_on_refused_on_cpu(tmp_path):
    """train.cuda_graph = on where the step cannot be a graph: exit 2, the key and the reason
    named, nothing written; auto and off train the cpu backend alike, step for step."""
    cfg = write_config(tmp_path, tiny(tmp_path))
    r = run(["train", "-c", cfg, "--device", "cpu", "--set", "train.cuda_graph=on"])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "train.cuda_graph = on" in r.stderr and "cpu backend" in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()
    losses = {}
    for mode in ("auto", "off"):
        d = tmp_path / mode
        r = run(["train", "-c", cfg, "--device", "cpu", "--set", f"log.dir={d}", "--set", "train.steps=12",
                 "--set", f"train.cuda_graph={mode}"])
        assert r.returncode == 0, r.stderr
        losses[mode] = [(e["loss"], e["grad_norm"], e["lr"]) for e in train_events(str(d))]
    assert len(losses["auto"]) == 12 and losses["auto"] == losses["off"]


def test_missing_shards_exit_2(tmp_path):
    cfg = tiny(tmp_path)
    cfg["data"] = {"train": str(tmp_path / "nothing_*.bin")}
    r = run(["train", "-c", write_config(tmp_path, cfg)])
    assert r.returncode == 2 and "nothing_" in r.stderr
    assert not (tmp_path / "run").exists()


def test_unwritable_log_dir_exit_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cfg = tiny(tmp_path)
    cfg["log"]["dir"] = str(blocker / "run")
    r = run(["train", "-c", write_config(tmp_path, cfg)])
    assert r.returncode == 2 and "log.dir" in r.stderr


def test_help_lists_every_key():
    r = run(["train", "--help"])
    assert r.returncode == 0
    for key in ["model.n_kv_head", "model.pos_embedding", "data.synthetic", "train.recompute", "optim.schedule",
                "precision.loss_scale", "attention.window", "log.keep_checkpoints", "train.divergence_steps",
                "train.divergence_factor"]:
        assert key in r.stdout
    for cmd in ["eval", "sample", "prepare", "bench"]:
        assert run([cmd, "--help"]).returncode == 0


# ---------------------------------------------------------------------------------------------
# training, logs, resume

def test_training_lowers_loss_and_logs(tmp_path):
    cfg = tiny(tmp_path)
    r = run(["train", "-c", write_config(tmp_path, cfg), "--set", "train.steps=60"])
    assert r.returncode == 0, r.stderr
    steps = train_events(cfg["log"]["dir"])
    assert [e["step"] for e in steps] == list(range(1, 61))
    first, last = steps[0]["loss"], sum(e["loss"] for e in steps[-10:]) / 10
    assert last < first - 0.3, (first, last)
    for key in ["lr", "grad_norm", "tokens_seen", "tok_per_s", "ms"]:
        assert key in steps[0]
    evals = train_events(cfg["log"]["dir"], "eval")
    assert [e["step"] for e in evals] == [20, 40, 60]
    assert train_events(cfg["log"]["dir"], "sample")  # at the end
    assert "step     10/60" in r.stdout and "tok/s" in r.stdout and "ETA" in r.stdout
    used = json.load(open(os.path.join(cfg["log"]["dir"], "config.json")))
    assert used["train"]["steps"] == 60  # the config after --set
    ckpts = sorted(d for d in os.listdir(cfg["log"]["dir"]) if d.startswith("ckpt_"))
    assert ckpts == ["ckpt_00000040", "ckpt_00000050", "ckpt_00000060"]  # keep_checkpoints 3


def test_classifier_chunk_trains_the_same(tmp_path):
    """train.classifier_chunk = 37 runs the head over 4 chunks of the 128 rows (a ragged last
    one), recomputing 3 chunks' logits in backward: the same losses as one chunk, to fp32 rounding
    (the wte gradient adds the chunks' shares in another order)."""
    losses = []
    for chunk in [0, 37]:
        cfg = tiny(tmp_path / str(chunk))
        r = run(["train", "-c", write_config(tmp_path, cfg, f"{chunk}.json"), "--set", "train.steps=20",
                 "--set", f"train.classifier_chunk={chunk}"])
        assert r.returncode == 0, r.stderr
        losses.append([e["loss"] for e in train_events(cfg["log"]["dir"])])
    assert len(losses[0]) == 20 and losses[0][0] == losses[1][0]
    for a, b in zip(*losses):
        assert abs(a - b) <= 1e-4 * abs(a), (a, b)


def _resume_losses(tmp_path, **sections):
    """Trains 40 steps in one go (a) and, in b, 40 steps stopped after the checkpoint at step 20
    and resumed; returns the per-step losses of both. sections update TINY's sections."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfgs = []
    for name in ["a", "b"]:
        cfg = tiny(tmp_path / name)
        for section, keys in sections.items():
            cfg.setdefault(section, {}).update(keys)
        cfgs.append(cfg)
    a, b = cfgs
    r = run(["train", "-c", write_config(tmp_path, a, "a.json")])
    assert r.returncode == 0, r.stderr
    b_path = write_config(tmp_path, b, "b.json")
    r = run(["train", "-c", b_path, "--set", "train.steps=40", "--set", "log.checkpoint_every=20"])
    assert r.returncode == 0
    # Simulate a stop after step 20: drop the later checkpoint and the logged steps after it.
    import shutil
    shutil.rmtree(os.path.join(b["log"]["dir"], "ckpt_00000040"))
    r = run(["train", "-c", b_path, "--set", "log.checkpoint_every=20"])
    assert r.returncode == 0, r.stderr
    assert "resuming from" in r.stdout and "ckpt_00000020" in r.stdout
    full = {e["step"]: e["loss"] for e in train_events(a["log"]["dir"])}
    resumed = {}
    for e in train_events(b["log"]["dir"]):
        resumed[e["step"]] = e["loss"]  # later lines (the resumed run) win
    return full, resumed


def test_resume_is_bitwise_exact(tmp_path):
    full, resumed = _resume_losses(tmp_path)
    for step in range(21, 41):
        assert resumed[step] == full[step], (step, resumed[step], full[step])


def test_resume_with_dropout_is_bitwise_exact(tmp_path):
    # The masks are a function of the step and micro-step (grad_accum 2 gives two per step), so
    # the resumed run draws the ones the uninterrupted run drew.
    drop = {"model": {"dropout": 0.2}, "attention": {"dropout": 0.2}, "train": {"grad_accum": 2}}
    full, resumed = _resume_losses(tmp_path / "drop", **drop)
    for step in range(21, 41):
        assert resumed[step] == full[step], (step, resumed[step], full[step])
    plain, _ = _resume_losses(tmp_path / "plain", train={"grad_accum": 2})
    assert all(full[s] != plain[s] for s in range(1, 41))  # dropout really is on


def test_resume_draws_the_same_samples(tmp_path):
    # The checkpoint at step 20 is written while that step's sample runs, and holds the RNG as
    # it is after the sample: the resumed run's samples at 30 and 40 are the uninterrupted run's.
    _resume_losses(tmp_path, log={"sample_every": 10})
    texts = {}
    for name in ["a", "b"]:
        for e in train_events(str(tmp_path / name / "run"), "sample"):
            texts.setdefault(name, {})[e["step"]] = e["text"]  # later lines (the resumed run) win
    assert sorted(texts["a"]) == [10, 20, 30, 40] and sorted(texts["b"]) == [10, 20, 30, 40]
    assert texts["a"] == texts["b"]
    assert len(set(texts["a"].values())) == 4   # each sample is a new draw


def test_resume_refuses_other_architecture(tmp_path):
    cfg = tiny(tmp_path)
    path = write_config(tmp_path, cfg)
    assert run(["train", "-c", path, "--set", "train.steps=10"]).returncode == 0
    r = run(["train", "-c", path, "--set", "model.n_layer=3"])
    assert r.returncode == 2 and "model.n_layer" in r.stderr


def test_damaged_checkpoint_is_reported(tmp_path):
    cfg = tiny(tmp_path)
    path = write_config(tmp_path, cfg)
    assert run(["train", "-c", path, "--set", "train.steps=10"]).returncode == 0
    ck = os.path.join(cfg["log"]["dir"], "ckpt_00000010")
    with open(os.path.join(ck, "model.safetensors"), "r+b") as f:
        f.truncate(100)
    r = run(["train", "-c", path, "--set", "train.steps=20"])
    assert r.returncode == 2 and "model.safetensors" in r.stderr
    os.remove(os.path.join(ck, "state.json"))
    r = run(["eval", "--checkpoint", ck, "--data", "x"])
    assert r.returncode == 2 and "state.json" in r.stderr


def _kill_during_checkpoints(tmp_path, delay):
    """Starts a run that writes a checkpoint every step, waits until one is complete, then
    SIGKILLs it `delay` seconds later: with most of its time spent writing checkpoints, the kill
    lands inside a write (or a pruning of old ones) most of the time."""
    cfg = tiny(tmp_path)
    cfg["model"].update({"n_embd": 128, "n_head": 4, "n_layer": 4, "vocab_size": 512})  # ~1M params: slower writes
    cfg["train"]["steps"] = 100000
    cfg["log"].update({"checkpoint_every": 1, "keep_checkpoints": 2, "eval_every": 0})
    path = write_config(tmp_path, cfg)
    run_dir = cfg["log"]["dir"]
    p = subprocess.Popen([BIN, "train", "-c", path], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        if os.path.isdir(run_dir) and any(d.startswith("ckpt_") for d in os.listdir(run_dir)):
            break
        time.sleep(0.01)
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    p.wait()
    return cfg, path


@pytest.mark.parametrize("delay", [0.0, 0.13, 0.37, 0.71])
def test_sigkill_during_checkpoint_loses_nothing(tmp_path, delay):
    cfg, path = _kill_during_checkpoints(tmp_path, delay)
    run_dir = cfg["log"]["dir"]
    ckpts = sorted(d for d in os.listdir(run_dir) if d.startswith("ckpt_"))
    assert ckpts, "no checkpoint completed before the kill"
    latest = int(ckpts[-1][5:])
    r = run(["train", "-c", path, "--set", f"train.steps={latest + 1}"])
    assert r.returncode == 0, r.stderr
    assert f"step {latest})" in r.stdout


def test_disk_full_keeps_previous_checkpoint(tmp_path):
    cfg = tiny(tmp_path)
    path = write_config(tmp_path, cfg)
    assert run(["train", "-c", path, "--set", "train.steps=10"]).returncode == 0

    def limit():  # writes past 64 KiB fail with EFBIG, as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    r = subprocess.run([BIN, "train", "-c", path, "--set", "train.steps=20"], cwd=ROOT, capture_output=True,
                       text=True, preexec_fn=limit)
    assert r.returncode == 1 and "checkpoint" in r.stderr
    run_dir = cfg["log"]["dir"]
    assert sorted(d for d in os.listdir(run_dir) if d.startswith("ckpt_")) == ["ckpt_00000010"]
    r = run(["sample", "--checkpoint", os.path.join(run_dir, "ckpt_00000010"), "--tokens", "5"])
    assert r.returncode == 0, r.stderr  # the older checkpoint is intact and loads


# ---------------------------------------------------------------------------------------------
# eval and sample from a checkpoint

def test_sample_from_checkpoint(tmp_path):
    cfg = tiny(tmp_path)
    assert run(["train", "-c", write_config(tmp_path, cfg), "--set", "train.steps=10"]).returncode == 0
    ck = os.path.join(cfg["log"]["dir"], "ckpt_00000010")
    r1 = run(["sample", "--checkpoint", ck, "--tokens", "20", "--seed", "3"])
    r2 = run(["sample", "--checkpoint", ck, "--tokens", "20", "--seed", "3"])
    assert r1.returncode == 0, r1.stderr
    assert r1.stdout == r2.stdout and r1.stdout.count("<") >= 20  # ids shown without a tokenizer
    r3 = run(["sample", "--checkpoint", ck, "--tokens", "20", "--temperature", "0"])
    assert r3.returncode == 0


def test_plot_metrics_writes_png(tmp_path):
    cfg = tiny(tmp_path)
    assert run(["train", "-c", write_config(tmp_path, cfg), "--set", "train.steps=20"]).returncode == 0
    out = tmp_path / "plot.png"
    r = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "scripts", "plot_metrics.py"), cfg["log"]["dir"],
                        os.path.join(cfg["log"]["dir"], "metrics.jsonl"), "-o", str(out), "--smooth", "3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10000
    r = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "scripts", "plot_metrics.py"), str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "nope" in r.stderr


def test_bench_reports_throughput(tmp_path):
    cfg = tiny(tmp_path)
    r = run(["bench", "-c", write_config(tmp_path, cfg), "--steps", "2", "--device", "cpu"])
    assert r.returncode == 0, r.stderr
    assert "tokens/s" in r.stdout and "ms/step" in r.stdout
    assert not os.path.exists(cfg["log"]["dir"])  # bench writes nothing


ATTN_LINE = re.compile(r"^bench attention: cpu backend \(fp32\), (flash|naive), batch 4 x seq 32, "
                       r"2 heads \((1|2) kv\) of 16, causal(, window 5)?: forward ([0-9.]+) ms "
                       r"\(([0-9.e+-]+) TFLOP/s\), backward ([0-9.]+) ms \(([0-9.e+-]+) TFLOP/s\)$")


@pytest.mark.parametrize("sets", [[], ["attention.impl=naive", "attention.window=5", "model.n_kv_head=1"]])
def test_bench_attention_times_one_layer(tmp_path, sets):
    # --attention: one line with the layer's shape and positive times and rates, nothing written.
    cfg = tiny(tmp_path)
    args = ["bench", "-c", write_config(tmp_path, cfg), "--steps", "2", "--attention", "--device", "cpu"]
    for s in sets:
        args += ["--set", s]
    r = run(args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, r.stdout
    m = ATTN_LINE.match(lines[0])
    assert m, lines[0]
    assert m.group(1) == ("naive" if sets else "flash") and bool(m.group(3)) == bool(sets)
    assert all(float(m.group(k)) > 0 for k in (4, 5, 6, 7)), lines[0]
    assert not os.path.exists(cfg["log"]["dir"])


RING_PHASE = re.compile(r"^  (pack|kernel|merge|fill|add|store) +([0-9.]+) \( *([0-9.]+)\) +([0-9.]+) \( *([0-9.]+)\)$")


def test_bench_attention_ring_breakdown(tmp_path):
    # dist.context_parallel = 2: the ring's summed line, then its device time by phase (forward,
    # backward; ops in brackets): every call's kernel merged once forward, one output store per
    # rank, and the totals beside the unsplit call.
    cfg = tiny(tmp_path)
    r = run(["bench", "-c", write_config(tmp_path, cfg), "--steps", "2", "--attention", "--device", "cpu",
             "--set", "dist.context_parallel=2"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert "context parallelism 2" in lines[1] and "by phase" in lines[2], r.stdout
    phases = {m.group(1): m for m in map(RING_PHASE.match, lines[3:9]) if m}
    assert sorted(phases) == sorted(["pack", "kernel", "merge", "fill", "add", "store"]), r.stdout
    kernel, merge, store = phases["kernel"], phases["merge"], phases["store"]
    assert float(kernel.group(2)) > 0 and float(kernel.group(4)) > 0, r.stdout
    assert kernel.group(3) == merge.group(3) and float(kernel.group(3)) > 0, r.stdout
    assert float(store.group(3)) == 2 and float(merge.group(5)) == 0, r.stdout
    assert lines[9].startswith("  total") and lines[10].startswith("  unsplit"), r.stdout


# ---------------------------------------------------------------------------------------------
# scripts/long_copy_proof.sh (the proof that long context is learned)

COPY_PROOF = os.path.join(ROOT, "scripts", "long_copy_proof.sh")
# The script runs ./train_gpt: not the binary under test when TRAIN_GPT names another build.
proof_binary = pytest.mark.skipif(BIN != os.path.join(ROOT, "train_gpt"),
                                  reason="scripts/long_copy_proof.sh runs ./train_gpt, not TRAIN_GPT")


def copy_proof(tmp_path, args, **env):
    env = {**os.environ, "RUN": str(tmp_path / "copy"), **env}
    return subprocess.run(["bash", COPY_PROOF] + args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)


@proof_binary
@pytest.mark.parametrize("args, needle", [(["1000"], "multiple of 1024"), (["262144"], "multiple of 1024"),
                                          (["8k"], "usage"), (["8192", "x"], "usage"),
                                          (["8192", "1024"], "WINDOW"), (["8192", "0"], "WINDOW")])
def test_copy_proof_bad_arguments_exit_2(tmp_path, args, needle):
    r = copy_proof(tmp_path, args)
    assert r.returncode == 2 and needle in r.stderr, (r.returncode, r.stderr)
    assert not (tmp_path / "copy").exists() and not (tmp_path / "copy_window").exists()


@proof_binary
def test_copy_proof_runs_both_stages_and_the_control(tmp_path):
    # SEQ 16384: stage 1 at 8192, stage 2 at 16384 resumed from it; the control beside it with
    # the default window SEQ/16. A one-layer, 32-wide model so that it runs in seconds on the CPU.
    small = ["--device", "cpu", "--set", "precision.dtype=fp32", "--set", "model.n_layer=1", "--set",
             "model.n_embd=32", "--set", "model.n_head=2", "--set", "model.n_kv_head=2", "--set",
             "train.batch_size=1", "--set", "log.eval_tokens=16384"]
    r = copy_proof(tmp_path, ["16384", "--"] + small, STEPS1="2", STEPS="1")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for name, window in (("copy", -1), ("copy_window", 1024)):  # -1: no window
        d = tmp_path / name
        stages = [line.split("\t") for line in (d / "stages.tsv").read_text().splitlines()]
        assert [(s[0], s[1]) for s in stages] == [("seq8192", "2"), ("seq16384", "3")], stages
        assert all(0 < float(s[2]) < 10 for s in stages), stages
        cfg = json.loads((d / "config.json").read_text())
        assert cfg["data"]["synthetic"] == "copy" and cfg["train"]["seq_len"] == 16384
        assert cfg["model"]["vocab_size"] == 256 and cfg["attention"]["window"] == window
        assert [e["step"] for e in train_events(str(d), "eval")][-1] == 3
