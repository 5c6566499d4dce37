"""Mutation check: known-wrong patches must make the relevant tests fail.

A test that cannot fail is a defect. This script copies the repository's tracked files (as they
are in the working tree) to a temporary directory, checks that the listed tests pass there
unmutated, then applies one deliberate bug at a time -- each a single exact string replacement in
one source file -- runs the tests of that area (``-p no:randomly``, one process, one thread) and
records which of them fail. It exits 1 if a mutation survives (its tests all pass), if a
mutation no longer applies (the patched text is gone: update the list), or if the unmutated
baseline fails.

``--tests-from DIR`` runs the mutants against another ``tests/`` folder (e.g. an older checkout's)
to show which mutations that suite let through; the exit status then only reflects the baseline.

Usage::

    python tools/mutation_check.py [--only NAME ...] [--tests-from DIR] [--json OUT.json]

Run from the repository root with the project's Python (the one with pytest installed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    """One deliberate bug: replace ``old`` (exactly once) by ``new`` in ``path``."""

    name: str
    area: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str = ""


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "vmf_kappa_1e-3",
        "vMF sampling",
        "bayesurl/methods/_vmf.py",
        "samples = sample_vmf(mu, kappa, s) if s > 0 else None",
        "samples = sample_vmf(mu, 1e-3 * kappa, s) if s > 0 else None",
        (
            "tests/methods/test_mcinfonce.py",
            "tests/methods/test_elk.py",
            "tests/methods/test_nivmf.py",
            "tests/methods/test_hib.py",
        ),
        "the vMF methods draw their samples with a 1000x too small concentration",
    ),
    Mutation(
        "evaluate_output_kappa_1e-3",
        "vMF sampling (evaluator)",
        "bayesurl/evaluation/evaluator.py",
        "samples = sample_vmf(emb, kappa, n_samples, generator=gen)",
        "samples = sample_vmf(emb, 1e-3 * kappa, n_samples, generator=gen)",
        ("tests/evaluation/test_evaluator.py",),
        "evaluate_output draws the ECE samples from a wrong concentration",
    ),
    Mutation(
        "laplace_trace_no_projection",
        "Laplace predictive",
        "bayesurl/laplace/metric.py",
        "trace = (var * (1.0 - u * u)).sum(dim=1) / norm2",
        "trace = var.sum(dim=1) / norm2",
        ("tests/laplace/test_metric.py",),
        "the predictive trace forgets the normalisation's projection (1 - u_d^2)",
    ),
    Mutation(
        "laplace_hessian_scale_ignored",
        "Laplace predictive",
        "bayesurl/laplace/metric.py",
        "return self.hessian_scale * self.hessian.clamp_min(0.0) + prior",
        "return self.hessian.clamp_min(0.0) + prior",
        ("tests/laplace/test_metric.py",),
        "the posterior precision ignores hessian_scale (beta)",
    ),
    Mutation(
        "laplace_prior_clip_wrong_end",
        "Laplace prior",
        "bayesurl/laplace/metric.py",
        "    if grad(hi) > 0:\n        best = hi",
        "    if grad(hi) > 0:\n        best = lo",
        ("tests/laplace/test_metric.py",),
        "optimize_prior_precision clips to the wrong bound",
    ),
    Mutation(
        "laplace_wrapper_trace_no_projection",
        "Laplace predictive (post-hoc wrapper)",
        "bayesurl/laplace/metric.py",
        "trace = (var * (1.0 - u * u)).sum(dim=1) / norm2",
        "trace = var.sum(dim=1) / norm2",
        ("tests/posthoc/test_wrap.py",),
        "the closed form the post-hoc wrapper's u comes from forgets the projection",
    ),
    Mutation(
        "pvu_always_first_pass",
        "PVU",
        "bayesurl/posthoc/pvu.py",
        "batches = cache.batches(batch_size, pass_index=epoch, generator=generator)",
        "batches = cache.batches(batch_size, pass_index=0, generator=generator)",
        ("tests/posthoc/test_pvu.py",),
        "cached PVU training reuses the first augmentation pass every epoch",
    ),
    Mutation(
        "cache_fingerprint_unchecked",
        "cache",
        "bayesurl/posthoc/pvu.py",
        "            cache.check_encoder(self.encoder)",
        "            pass",
        ("tests/posthoc/test_pvu.py",),
        "fit(cache=...) trains on another encoder's embeddings",
    ),
    Mutation(
        "cache_rows_unpermuted",
        "cache",
        "bayesurl/features/store.py",
        "out[order] = array[index[order]]",
        "out[:] = array[index[order]]",
        ("tests/posthoc/test_pvu.py", "tests/features/test_store.py"),
        "rows() returns the embeddings in disk order, not in the requested order",
    ),
    Mutation(
        "evaluate_cli_labels_rolled",
        "evaluator CLI",
        "bayesurl/commands/evaluate.py",
        'arrays.pop("labels"),',
        'arrays.pop("labels").roll(1),',
        ("tests/evaluation/test_cli.py",),
        "the .npz labels reach evaluate() misaligned with the embeddings",
    ),
    Mutation(
        "pipeline_ood_swapped",
        "pipeline output (score)",
        "bayesurl/runs/predict.py",
        "ood_uncertainties=o_ood.uncertainty,",
        "ood_uncertainties=o_id.uncertainty,",
        ("tests/commands/test_evaluate_checkpoint.py",),
        "the pipeline's OOD AUROC treats the in-distribution set as OOD",
    ),
    Mutation(
        "grad_scaler_not_restored",
        "training (AMP)",
        "bayesurl/training/trainer.py",
        '            if ckpt["scaler"]:\n                self.scaler.load_state_dict',
        "            if False:\n                self.scaler.load_state_dict",
        ("tests/training/test_training_amp_clip.py",),
        "resume drops the GradScaler's scale and growth tracker",
    ),
    Mutation(
        "grad_clip_doubled",
        "training (clipping)",
        "bayesurl/training/trainer.py",
        "torch.nn.utils.clip_grad_norm_(self.params, self.clip_grad)",
        "torch.nn.utils.clip_grad_norm_(self.params, 2 * self.clip_grad)",
        ("tests/training/test_training_amp_clip.py",),
        "gradients are clipped to twice the requested norm",
    ),
)


@dataclass
class Result:
    name: str
    area: str
    status: str  # "killed", "SURVIVED", "STALE"
    failing: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _tracked_files(root: Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    return [p for p in out.decode().split("\0") if p and (root / p).is_file()]


def _copy_tree(root: Path, dest: Path, tests_from: Path | None) -> None:
    for rel in _tracked_files(root):
        if tests_from is not None and rel.startswith("tests/"):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
    if tests_from is not None:
        shutil.copytree(tests_from, dest / "tests", ignore=shutil.ignore_patterns("__pycache__"))


def _pytest(copy: Path, tests: list[str], timeout: float) -> tuple[int, list[str], str]:
    env = dict(os.environ, PYTHONPATH=str(copy), OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider"]
    cmd += ["-p", "no:randomly", "-W", "ignore", *tests]
    try:
        proc = subprocess.run(
            cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return 124, [], "timeout"
    text = proc.stdout + proc.stderr
    failing = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", text, flags=re.M)))
    return proc.returncode, failing, text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", help="run only these mutations (by name)")
    ap.add_argument("--tests-from", type=Path, help="a tests/ folder to use instead of ours")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run")
    args = ap.parse_args(argv)
    muts = [m for m in MUTATIONS if not args.only or m.name in args.only]
    if args.only and len(muts) != len(set(args.only)):
        known = ", ".join(m.name for m in MUTATIONS)
        raise SystemExit(f"unknown mutation in --only; known: {known}")
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="bayesurl-mutants-") as tmp:
        copy = Path(tmp) / "repo"
        _copy_tree(ROOT, copy, args.tests_from)
        all_tests = sorted({t for m in muts for t in m.tests if (copy / t).exists()})
        t0 = time.perf_counter()
        rc, failing, text = _pytest(copy, all_tests, args.timeout)
        print(
            f"baseline ({len(all_tests)} test files, unmutated): rc={rc} "
            f"{time.perf_counter() - t0:.0f}s",
            flush=True,
        )
        if rc != 0:
            print(text[-4000:])
            print("the unmutated baseline fails: fix that first", file=sys.stderr)
            return 1
        for m in muts:
            src = copy / m.path
            original = src.read_text()
            n = original.count(m.old)
            if n != 1:
                results.append(Result(m.name, m.area, "STALE"))
                print(f"{m.name:36s} STALE ({m.path}: patched text found {n} times)", flush=True)
                continue
            tests = [t for t in m.tests if (copy / t).exists()]
            if not tests:  # e.g. --tests-from an older suite without these files
                results.append(Result(m.name, m.area, "SURVIVED"))
                print(f"{m.name:36s} SURVIVED (none of its test files exist)", flush=True)
                continue
            src.write_text(original.replace(m.old, m.new))
            try:
                t0 = time.perf_counter()
                rc, failing, _ = _pytest(copy, tests, args.timeout)
                dt = time.perf_counter() - t0
            finally:
                src.write_text(original)
            status = "killed" if rc != 0 else "SURVIVED"
            results.append(Result(m.name, m.area, status, failing, round(dt, 1)))
            print(f"{m.name:36s} {status:8s} {dt:5.0f}s  [{m.area}] {m.why}", flush=True)
            for f in failing:
                print(f"    {f}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1))
    bad = [r for r in results if r.status != "killed"]
    print(f"\n{len(results) - len(bad)}/{len(results)} mutations killed")
    if args.tests_from is not None:
        return 0
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
