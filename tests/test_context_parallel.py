"""Context parallelism (dist.context_parallel: ring attention over a zigzag split of each
sequence) on the CPU backend with Open MPI, against one process holding the whole sequence.

1. The oracle (tests/tools/gpt_oracle under mpirun -np N, dist.context_parallel = N): the whole
   group's logits, loss and every gradient (summed over the ranks), and a 20-step training run,
   against float64 PyTorch autograd and torch.optim.AdamW (test_oracle's reference), for learned
   positions, RoPE (6 of 16 dimensions), GQA and MQA, ALiBi, sliding windows (every layer,
   even layers only) and activation recomputation. T = 40: 2 ranks hold chunks of 10 tokens, 4 ranks chunks of 5 (odd, not a
   multiple of any tile).
2. train_gpt itself: mpirun -np 2 (CP 2), -np 4 (CP 4) and -np 4 (DP 2 x CP 2) against one
   process (batch B, or 2B for DP 2): the 20-step loss curve, gradient norms, val loss and final
   weights; resume across context-parallel sizes and `train_gpt eval` of a CP checkpoint on one
   process; bad settings exit 2 naming the keys. (A killed or a hung rank of a group ending the
   job: tests/test_dist.py's fault tests, with dist.context_parallel = 2 too.)

Tolerances. The ring computes the same sums as one process in another order: each query's
softmax over key chunks is merged through the log-sum-exp (a few fp32 roundings per merge), dK
and dV add up over chunks and ranks, and the gradients are summed over the ranks. So the
group's result is another fp32 rounding of the same function: its error against float64 is of
the size of the one-process run's own (measured over the cases below: worst tensor 6.4e-7 from
float64 with CP, 6.8e-7 for one process; CP against one process at most 6.3e-7). Each oracle case asserts, per tensor, error(CP) <= 4 x error(one
process) + 2e-7 (a few units of 2^-24 ~ 6e-8 for tensors the one process gets nearly exact)
and below test_oracle's GRAD_RTOL (1e-5). The training comparisons use test_oracle's and
test_dist's bounds, whose derivations hold here unchanged (only the summation order differs).
"""
import json
import os
import subprocess

import numpy as np
import pytest
import torch

from oracle_st import read_safetensors
from test_dist import (LOSS_RTOL, MPIRUN, WEIGHT_RTOL, B, T, config, env, events, losses,
                       make_shards, rel_l2, train, weights)
from test_oracle import (GRAD_RTOL, ROOT, TOOL, TOOL_TARGET, compare_training, key_bias_slice,
                         reference)

needs_mpi = pytest.mark.skipif(MPIRUN is None, reason="mpirun (openmpi-bin) is not installed")
BIN = os.path.join(str(ROOT), "train_gpt")

ORACLE_T = 40
ROPE = ["model.pos_embedding=rope"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("cp_shards"))


def run_oracle(tmp_path, name, ranks, settings):
    """gpt_oracle on `ranks` processes (context_parallel = ranks; 1 = one process)."""
    subprocess.run(["make", "-s", "-C", str(ROOT), TOOL_TARGET], check=True)
    out = tmp_path / f"{name}.safetensors"
    args = [str(TOOL), str(out), "--set", f"train.seq_len={ORACLE_T}"]
    for s in settings + ([f"dist.context_parallel={ranks}"] if ranks > 1 else []):
        args += ["--set", s]
    if ranks > 1:
        args = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)] + args
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env())
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    tensors, meta = read_safetensors(out)
    return tensors, json.loads(meta["config"]), set(filter(None, meta["decayed"].split(",")))


def float64_reference(t, cfg):
    tokens = torch.as_tensor(t["tokens"]).long()
    targets = torch.as_tensor(t["targets"]).long()
    model = reference(t, cfg, torch.float64)
    logits, loss = model(tokens, targets)
    loss.backward()
    return {"logits": logits.detach().numpy(), "loss": loss.item(),
            **{"grad." + n: w.grad.numpy() for n, w in model.named_weights()}}


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


ORACLE_CASES = [
    ("learned, GQA 4:2", 2, []),
    ("rope, 6 of 16 dimensions rotated", 4, ROPE + ["model.rope_dims=6"]),
    ("rope, MQA", 2, ROPE + ["model.n_kv_head=1"]),
    ("learned, window 7 (whole chunk pairs skipped)", 2, ["attention.window=7"]),
    ("rope, window 3 on even layers", 4, ROPE + ["attention.window=3", "attention.window_every=2"]),
    ("alibi, window 12", 4, ["model.pos_embedding=alibi", "attention.window=12"]),
    # Recomputation reruns the ring forward inside backward (attn_gelu: attention alone; block:
    # the whole block), on every rank in the same order.
    ("learned, recompute attn_gelu", 2, ["train.recompute=attn_gelu"]),
    ("rope, recompute block", 4, ROPE + ["train.recompute=block"]),
    # An odd ring: T = 42 in 6 chunks of 7.
    ("rope, window 9, odd ring", 3, ROPE + ["train.seq_len=42", "attention.window=9"]),
]


@needs_mpi
@pytest.mark.parametrize("label,ranks,settings", ORACLE_CASES,
                         ids=[f"{c[0]}-np{c[1]}" for c in ORACLE_CASES])
def test_ring_matches_one_process_and_float64(tmp_path, label, ranks, settings):
    one, cfg, _ = run_oracle(tmp_path, "one", 1, settings)
    cp, cfg_cp, _ = run_oracle(tmp_path, "cp", ranks, settings)
    assert cfg_cp["dist"]["context_parallel"] == ranks
    assert cp["logits"].shape == one["logits"].shape == (3, cfg["train"]["seq_len"], 101)
    assert np.array_equal(cp["tokens"], one["tokens"]) and (cp["targets"] < 0).any()
    ref = float64_reference(one, cfg)
    kb = key_bias_slice(cfg)
    errs, errs1 = {}, {}
    for k in ref:
        a, b, r = cp[k], one[k], ref[k]
        if kb and k.endswith("attn.qkv.bias"):   # exactly 0 in float64: pure rounding noise
            keep = np.ones(np.shape(r), bool)
            keep[kb] = False
            a, b, r = a[keep], b[keep], r[keep]
        errs[k], errs1[k] = rel_err(a, r), rel_err(b, r)
    worst = max(errs, key=errs.get)
    vs_one = max(rel_err(cp[k], one[k]) for k in ref)
    print(f"\n[{label}, {ranks} ranks] worst rel err {errs[worst]:.2e} ({worst}; one process "
          f"{errs1[worst]:.2e}, worst one process {max(errs1.values()):.2e}); CP vs one process "
          f"{vs_one:.2e}")
    bad = {k: (errs[k], errs1[k]) for k in ref
           if not (errs[k] < GRAD_RTOL and errs[k] <= 4 * errs1[k] + 2e-7)}
    assert not bad, f"context parallel further from float64 than one process allows: {bad}"


@needs_mpi
@pytest.mark.parametrize("ranks,settings", [(2, ROPE + ["attention.window=7"]), (4, [])])
def test_ring_training_matches_float64_adamw(tmp_path, ranks, settings):
    """20 AdamW steps with context parallelism against float64 PyTorch on the same batches."""
    t, cfg, decayed = run_oracle(tmp_path, "cp", ranks, settings + [
        "train.steps=20", "optim.lr=3e-3", "optim.warmup_steps=2", "optim.min_lr=3e-4"])
    losses_, _ = compare_training(t, cfg, decayed, f"{ranks} ranks, 20 steps")
    assert losses_[-1] < losses_[0], "the oracle task must be learning"


# ---------------------------------------------------------------------------------------------
# train_gpt under mpirun against one process with the whole sequence


def assert_same_run(ref_dir, got_dir, steps, val=True, final_ckpt=None):
    l1, l2 = losses(ref_dir), losses(got_dir)
    assert sorted(l2) == steps, sorted(l2)
    for s in l2:
        assert abs(l2[s] - l1[s]) <= LOSS_RTOL * abs(l1[s]), (s, l1[s], l2[s])
    n1 = {e["step"]: e["grad_norm"] for e in events(ref_dir, "train")}
    n2 = {e["step"]: e["grad_norm"] for e in events(got_dir, "train")}
    for s in n2:
        assert abs(n2[s] - n1[s]) <= LOSS_RTOL * n1[s], (s, n1[s], n2[s])
    if val:
        v1 = {e["step"]: e["val_loss"] for e in events(ref_dir, "eval")}
        v2 = {e["step"]: e["val_loss"] for e in events(got_dir, "eval")}
        assert v2 and all(abs(v2[s] - v1[s]) <= LOSS_RTOL * v1[s] for s in v2), (v1, v2)
    if final_ckpt:
        w1 = weights(os.path.join(ref_dir, final_ckpt))
        w2 = weights(os.path.join(got_dir, final_ckpt))
        assert rel_l2(w2, w1) <= WEIGHT_RTOL


@needs_mpi
@pytest.mark.parametrize("ranks,cp,pos,bucket_mb", [(2, 2, "learned", None), (4, 4, "rope", None),
                                                   (4, 2, "rope", "0.001")],
                         ids=["np2-cp2-learned", "np4-cp4-rope", "np4-dp2xcp2-rope-buckets"])
def test_train_matches_one_process(tmp_path, shards, ranks, cp, pos, bucket_mb):
    # With 0.001 MiB buckets every layer's gradients start their reduce-scatter over the world
    # while the earlier layers' ring exchanges still run on the group's communicator.
    dp = ranks // cp
    model = {"pos_embedding": pos}
    one, one_dir = config(tmp_path, shards, "one", model=model, train={"batch_size": dp * B})
    par, par_dir = config(tmp_path, shards, "cp", model=model, dist={"context_parallel": cp})
    train(one, 1)
    r = train(par, ranks, extra_env={"FLASHGPT_BUCKET_MB": bucket_mb} if bucket_mb else None)
    assert f"context parallel: {dp} groups of {cp} ranks, each rank holds {T // cp} of the {T}" \
        in r.stdout, r.stdout
    assert_same_run(one_dir, par_dir, list(range(1, 21)), final_ckpt="ckpt_00000020")
    assert losses(one_dir)[20] < losses(one_dir)[1] - 0.5  # it learns
    seen = [events(d, "train")[-1]["tokens_seen"] for d in (one_dir, par_dir)]
    assert seen[0] == seen[1] == 20 * dp * B * T
    assert "---- sample at step 20" in r.stdout  # rank 0 samples alone, without the ring


@needs_mpi
def test_resume_across_context_parallel_sizes(tmp_path, shards):
    # A CP 2 run's step-10 checkpoint, resumed by one process (no CP) and by 4 ranks (CP 4),
    # continues the uninterrupted CP 2 run's curve: checkpoints do not depend on CP.
    model = {"pos_embedding": "rope"}
    ref, ref_dir = config(tmp_path, shards, "ref", model=model, dist={"context_parallel": 2})
    train(ref, 2)
    # `train_gpt eval` on one process reads the CP checkpoint and gets the run's val loss.
    r = subprocess.run([BIN, "eval", "--checkpoint", os.path.join(ref_dir, "ckpt_00000020"),
                        "--data", shards[1], "--tokens", "1024", "--device", "cpu"],
                       capture_output=True, text=True, timeout=60, env=env())
    assert r.returncode == 0, r.stderr
    got = float(r.stdout.split("val_loss:")[1])
    want = events(ref_dir, "eval")[-1]["val_loss"]
    assert abs(got - want) <= LOSS_RTOL * want, (got, want)
    for name, ranks, cp in (("one", 1, 1), ("four", 4, 4)):
        path, run_dir = config(tmp_path, shards, name, model=model, dist={"context_parallel": cp})
        os.makedirs(run_dir)
        subprocess.run(["cp", "-r", os.path.join(ref_dir, "ckpt_00000010"), run_dir], check=True)
        r = train(path, ranks)
        assert "resuming from" in r.stdout
        assert_same_run(ref_dir, run_dir, list(range(11, 21)), final_ckpt="ckpt_00000020")


@needs_mpi
def test_bench_runs_context_parallel(tmp_path, shards):
    path, _ = config(tmp_path, shards, "bench", dist={"context_parallel": 2})
    args = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2", BIN, "bench", "-c", path,
            "--device", "cpu", "--steps", "2"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=str(ROOT), env=env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert "bench: cpu backend" in r.stdout, r.stdout


@pytest.mark.parametrize("sets,needles", [
    ([], ["dist.context_parallel = 2 does not divide the 1 ranks"]),
    (["train.seq_len=14"], ["train.seq_len (14) must be a multiple of 4"]),
    (["attention.impl=naive"], ["attention.impl = flash"]),
    (["attention.dropout=0.1"], ["attention.dropout"]),
    (["data.eot_token=3", "attention.doc_mask=true"], ["attention.doc_mask"]),
])
def test_bad_context_parallel_settings_exit_2(tmp_path, shards, sets, needles):
    path, run_dir = config(tmp_path, shards, "bad", dist={"context_parallel": 2})
    args = [BIN, "train", "-c", path, "--device", "cpu"]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=str(ROOT), env=env())
    assert r.returncode == 2, r.stderr
    assert all(n in r.stderr for n in needles), r.stderr
    assert "dist.context_parallel" in r.stderr, r.stderr
    assert not os.path.exists(run_dir)


def test_fp32_context_parallel_on_the_gpu_exits_2(tmp_path, shards):
    # fp32 on the GPU runs the naive attention, which has no ring backward: refused before
    # anything is read or written (whether or not this build has CUDA), naming the keys.
    path, run_dir = config(tmp_path, shards, "fp32gpu", dist={"context_parallel": 2})
    args = [BIN, "train", "-c", path, "--device", "cuda", "--set", "precision.dtype=fp32"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=str(ROOT), env=env())
    assert r.returncode == 2, r.stderr
    assert "dist.context_parallel = 2 on the GPU needs precision.dtype = bf16 or fp16" in r.stderr, r.stderr
    assert not os.path.exists(run_dir)


@needs_mpi
def test_context_parallel_not_dividing_the_world_exits_2(tmp_path, shards):
    path, run_dir = config(tmp_path, shards, "bad", dist={"context_parallel": 4}, train={"seq_len": 16})
    args = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2", BIN, "train", "-c", path,
            "--device", "cpu"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=str(ROOT), env=env())
    assert r.returncode != 0 and "does not divide the 2 ranks" in r.stderr, r.stderr[-2000:]
    assert not os.path.exists(run_dir)

