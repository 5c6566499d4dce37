"""A fuzzer of the public surface: every public function of ``bayesurl.__all__`` and of each
sub-package's ``__all__`` that takes tensors or files gets a valid call built from its
signature (a table of example arguments by parameter name, below), then one argument at a time
replaced by a bad input of each class. The call must raise a ``ValueError`` / ``TypeError``
(``FileNotFoundError`` for a missing file) whose message names the argument, or return a
documented correct result (listed in ``ACCEPTED`` with the reason).

Counts (functions, calls, classes) are printed by ``test_fuzzer_counts`` (``pytest -s``).
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import bayesurl

N, D, C, S = 12, 4, 3, 3


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _unit(n: int = N, d: int = D) -> torch.Tensor:
    return F.normalize(torch.randn(n, d, generator=_gen()), dim=1)


def _pos(n: int = N) -> torch.Tensor:
    return torch.rand(n, generator=_gen()) + 1.0


_labels = lambda: torch.arange(N) % C  # noqa: E731
_correct = lambda: torch.arange(N) % 3 != 0  # noqa: E731

#: Valid example argument by parameter name (float32 tensors of N rows, D dims, C classes).
EXAMPLES: dict[str, Callable[[], Any]] = {
    "embeddings": lambda: torch.randn(N, D, generator=_gen()),
    "labels": _labels,
    "uncertainties": lambda: torch.rand(N, generator=_gen()),
    "ood_uncertainties": lambda: torch.rand(8, generator=_gen()) + 0.5,
    "reference": lambda: torch.rand(N, generator=_gen()),
    "correct": _correct,
    "scores": lambda: torch.rand(N, generator=_gen()),
    "positives": _correct,
    "confidence": lambda: torch.rand(N, generator=_gen()),
    "samples": lambda: torch.randn(S, N, D, generator=_gen()),
    "queries": lambda: torch.randn(5, D, generator=_gen()),
    "gallery": lambda: torch.randn(N, D, generator=_gen()),
    "mu": _unit,
    "loc": _unit,
    "kappa": _pos,
    "mu_anchor": _unit,
    "kappa_anchor": _pos,
    "mu_pos": lambda: _unit().flip(0),
    "kappa_pos": lambda: _pos().flip(0),
    "mu1": _unit,
    "kappa1": _pos,
    "mu2": lambda: _unit().flip(0),
    "kappa2": lambda: _pos().flip(0),
    "ref_mu": lambda: _unit(C),
    "ref_kappa": lambda: _pos(C),
    "proxy_mu": lambda: _unit(C),
    "proxy_kappa": lambda: _pos(C),
    "query_mu": lambda: _unit(5),
    "query_kappa": lambda: _pos(5),
    "z": _unit,
    "z1": lambda: torch.randn(N, D, generator=_gen()),
    "z2": lambda: torch.randn(N, D, generator=_gen()).flip(0),
    "s1": lambda: torch.randn(N, generator=_gen()),
    "s2": lambda: torch.randn(N, generator=_gen()).flip(0),
    "logits": lambda: torch.randn(N, C, generator=_gen()),
    "u": lambda: torch.rand(N, generator=_gen()),
    "n_samples": lambda: 2,
    "dim": lambda: D,
    "r": lambda: torch.rand(N, generator=_gen()) * 0.9,
    "x": lambda: torch.randn(N, D, generator=_gen()),
    "y": lambda: torch.rand(N, generator=_gen()),
    "w": lambda: torch.rand(N, generator=_gen()) * 2 - 1,
    "v": lambda: 1.5,
    "neighbor_labels": lambda: torch.randint(0, C, (N, 3), generator=_gen()),
    "trace": lambda: torch.rand(N, generator=_gen()) + 0.1,
    "diagonal": lambda: torch.randn(20, generator=_gen()),
    "q": lambda: 0.9,
    "k": lambda: 2,
}

#: Per-function example overrides (where a parameter's shape depends on the function).
OVERRIDES: dict[str, dict[str, Callable[[], Any]]] = {
    "bayesurl.heads.mean_field_logits": {"variance": lambda: torch.rand(N, generator=_gen())},
    "bayesurl.distributions.log_bessel_iv": {"x": lambda: torch.rand(N, generator=_gen()) * 5},
    "bayesurl.heads.average_log_probs": {"logits": lambda: torch.randn(S, N, C, generator=_gen())},
    "bayesurl.heads.inverse_softplus": {"y": lambda: torch.rand(N, generator=_gen()) + 0.1},
    "bayesurl.losses.contrastive_log_ratio": {
        "pos": lambda: torch.randn(N, generator=_gen()),
        "neg": lambda: torch.randn(N, 5, generator=_gen()),
    },
    "bayesurl.posthoc.mse_loss": {"task_loss": lambda: torch.rand(N, generator=_gen())},
    "bayesurl.posthoc.ranking_loss": {"task_loss": lambda: torch.rand(N, generator=_gen())},
    "bayesurl.posthoc.supcon_task_loss": {"embedding": lambda: torch.randn(N, D, generator=_gen())},
    **{
        f"bayesurl.losses.{f}": {"proxy_kappa": lambda: _pos(C)[:, None].expand(C, D).clone()}
        for f in ("nivmf_elk_logits", "nivmf_log_density", "nivmf_loss")
    },
}

#: Functions left out, with the reason (no tensor / file input, collective, plotting, ...).
SKIP = re.compile(
    r"(plot_|available|register|get$|create$|resolve_backbone|barrier|cleanup|init_from_env|"
    r"is_main_process|get_rng_state|seed_everything|wrap_ddp|all_gather|knn_sharded|"
    r"rank_budget|build_|even_milestones|multistep_factor|warmup_cosine|fit$|"
    r"train_|MetricLaplace|wrap$|as_encoder|spectral_normalize|encoder_fingerprint|"
    r"check_head_trainable|classifier_task_loss|prepare_batch|set_rng_state|"
    r"data\.|split_pairs|ggn_diagonal|output_hessian|hib_log_match|mc_softmax|"
    r"save_checkpoint|load)"
)


def public_functions() -> list[tuple[str, Callable[..., Any]]]:
    """``(qualified name, function)`` of every public function, each once."""
    seen: dict[int, tuple[str, Callable[..., Any]]] = {}
    for mod_name in ["bayesurl", *(f"bayesurl.{m}" for m in sorted(bayesurl._SUBMODULES))]:
        mod = importlib.import_module(mod_name)
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name, None)
            if inspect.isfunction(obj) and id(obj) not in seen:
                seen[id(obj)] = (f"{mod_name}.{name}", obj)
    return sorted(seen.values())


def valid_call(qual: str, fn: Callable[..., Any]) -> dict[str, Any] | None:
    """Keyword arguments of a valid call, or ``None`` when a required one has no example."""
    table = {**EXAMPLES, **OVERRIDES.get(qual, {})}
    kwargs: dict[str, Any] = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        optional_tensor = (
            p.name in table and torch.is_tensor(table[p.name]()) and "Tensor" in str(p.annotation)
        )
        if p.name in table and (p.default is inspect.Parameter.empty or optional_tensor):
            kwargs[p.name] = table[p.name]()
        elif p.default is inspect.Parameter.empty:
            return None
    return kwargs


#: Bad-input classes: name -> (applies to this tensor?, mutation)
def _poke(value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def mutate(t: torch.Tensor) -> torch.Tensor:
        bad = t.clone()
        bad.view(-1)[0] = value
        return bad

    return mutate


_floating = lambda t: t.is_floating_point() and t.numel() > 0  # noqa: E731

BAD: dict[str, tuple[Callable[[torch.Tensor], bool], Callable[[torch.Tensor], torch.Tensor]]] = {
    "nan": (_floating, _poke(math.nan)),
    "inf": (_floating, _poke(math.inf)),
    "integer": (lambda t: t.is_floating_point(), lambda t: (t * 3).round().long()),
    "float16": (lambda t: t.is_floating_point(), lambda t: t.half()),
    "wrong_rank": (lambda t: True, lambda t: t.unsqueeze(-1)),
    "empty_batch": (lambda t: t.ndim >= 1 and t.shape[0] > 1, lambda t: t[:0]),
    "mismatched_length": (lambda t: t.ndim >= 1 and t.shape[0] > 2, lambda t: t[:-1]),
}


def _tensors(kwargs: dict[str, Any]) -> list[str]:
    return [k for k, v in kwargs.items() if torch.is_tensor(v)]


def bad_calls(only: str | None = None) -> list[tuple[str, str, str, Callable[[], Any]]]:
    """``(function, argument, class, call)`` for every applicable bad input."""
    out = []
    for qual, fn in public_functions():
        if (only is not None and qual != only) or SKIP.search(qual.removeprefix("bayesurl.")):
            continue
        kwargs = valid_call(qual, fn)
        if kwargs is None or not _tensors(kwargs):
            continue
        lengths = {k: kwargs[k].shape[0] for k in _tensors(kwargs) if kwargs[k].ndim >= 1}
        for arg in _tensors(kwargs):
            for cls, (applies, mutate) in BAD.items():
                t = kwargs[arg]
                if not applies(t):
                    continue
                if cls == "mismatched_length" and list(lengths.values()).count(t.shape[0]) < 2:
                    continue  # nothing to mismatch with
                bad = {**kwargs, arg: mutate(t)}
                out.append((qual, arg, cls, lambda fn=fn, bad=bad: fn(**bad)))
    return out


#: Elementwise functions: a tensor of any shape (another rank, an empty batch) is a valid input
#: and gives a result of its shape (their docstrings: "any shape", "elementwise").
ELEMENTWISE = re.compile(
    r"(kappa_from_resultant_length|vmf_log_normalizer|vmf_mean_resultant_length|"
    r"vmf_cosine_grad_kappa|credible_threshold|vmf_cosine_quantile|kappa_from_trace|"
    r"clamped_fraction|evaluation\.normalize|log_bessel_iv|inverse_softplus|nivmf_log_density)$"
)


#: Math kernels called on every training step (their callers validate once): non-finite input
#: propagates visibly (a NaN in gives a NaN out, checked) instead of a per-step check.
KERNELS = re.compile(
    r"(evaluation\.normalize|contrastive_log_ratio|inverse_softplus|log_bessel_iv|"
    r"average_log_probs)$"
)


def _accepted_reason(qual: str, arg: str, cls: str) -> str | None:
    """Why a call that returned is a documented correct result (None: it should have raised)."""
    if cls in ("integer", "float16"):
        return "cast"  # one dtype rule: computed as float32 of the same values (checked)
    if cls == "inf" and ("kappa" in arg or arg in ("s1", "s2")):
        return "limit"  # kappa = inf is the point mass; s = inf the SimCLR limit (docstrings)
    if cls == "nan" and arg == "task_loss":
        return "documented"  # PVU: a NaN task loss marks an anchor without one; left out
    if cls in ("wrong_rank", "empty_batch") and ELEMENTWISE.search(qual):
        return "elementwise"
    if cls in ("nan", "inf") and KERNELS.search(qual):
        return "kernel"  # math kernels of the losses' hot path: NaN in, NaN out (checked)
    return None


def _flat(result: Any) -> list[torch.Tensor]:
    if torch.is_tensor(result):
        return [result.detach()]
    if isinstance(result, float | int) and not isinstance(result, bool):
        return [torch.tensor(float(result))]
    if isinstance(result, tuple | list):
        return [t for r in result for t in _flat(r)]
    if isinstance(result, dict):
        return [t for k in sorted(result) for t in _flat(result[k])]
    return []


def _same(a: Any, b: Any) -> bool:
    xs, ys = _flat(a), _flat(b)
    return len(xs) == len(ys) and all(
        x.shape == y.shape
        and torch.allclose(x.double(), y.double(), rtol=2e-2, atol=2e-2, equal_nan=True)
        for x, y in zip(xs, ys)
    )


_NAMED = "`{}`"


def _names(message: str, arg: str, cls: str, tensors: list[str]) -> bool:
    if arg in message:
        return True
    # a length is relative: naming the argument it was compared with is as clear
    return cls in ("mismatched_length", "empty_batch") and any(t in message for t in tensors)


def _fuzz(qual: str, fn: Callable[..., Any]) -> tuple[int, list[str]]:
    """Run every bad call of ``fn``; returns (number of calls, failures)."""
    kwargs = valid_call(qual, fn)
    assert kwargs is not None
    failures, calls = [], 0
    for _, arg, cls, call in bad_calls(only=qual):
        calls += 1
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.manual_seed(0)  # the sampling losses draw from the global generator
                result = call()
        except (ValueError, TypeError) as exc:
            if not _names(str(exc), arg, cls, _tensors(kwargs)):
                failures.append(f"{arg}/{cls}: error does not name `{arg}`: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - any other error is a finding
            failures.append(f"{arg}/{cls}: {type(exc).__name__} leaked: {str(exc)[:200]}")
            continue
        why = _accepted_reason(qual, arg, cls)
        if why is None:
            failures.append(f"{arg}/{cls}: accepted silently")
        elif why == "cast" and any(t.dtype == torch.float16 for t in _flat(result)):
            # computed in the input's half precision (dtype follows the input): finite only
            if not all(bool(torch.isfinite(t).all()) for t in _flat(result)):
                failures.append(f"{arg}/{cls}: non-finite half-precision result")
        elif why == "cast":
            as_float = {**kwargs, arg: BAD[cls][1](kwargs[arg]).float()}
            torch.manual_seed(0)
            if not _same(result, fn(**as_float)):
                failures.append(f"{arg}/{cls}: differs from the float32 call on the same values")
        elif why == "limit" and any(bool(torch.isnan(t).any()) for t in _flat(result)):
            failures.append(f"{arg}/{cls}: NaN in the result")
        elif (
            why == "kernel"
            and cls == "nan"
            and not any(bool(torch.isnan(t).any()) for t in _flat(result))
        ):
            failures.append(f"{arg}/{cls}: a NaN input gave a NaN-free result")
    return calls, failures


def _encoder() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 4)


def _write_checkpoint(path):
    from bayesurl.training import save_checkpoint
    from bayesurl.training.checkpoint import CHECKPOINT_FORMAT

    state = {"model": {"w": torch.ones(64, 64)}, "format": CHECKPOINT_FORMAT, "version": 1}
    save_checkpoint(state, path)


def _write_wrapper(path):
    from bayesurl.posthoc import wrap

    w = wrap(_encoder(), "laplace")
    w.fit([(torch.randn(16, 3, generator=_gen()), torch.arange(16) % 2)], progress=False)
    w.save(path)


def _write_cache(path):
    from bayesurl.posthoc import EmbeddingCache

    enc = torch.nn.Linear(3, 4)
    EmbeddingCache.build(enc, [torch.randn(64, 3, generator=_gen())], path, progress=False)
    return path / "features.npy"


def _read_idx(path):
    from bayesurl.data import read_idx

    return read_idx(path)


def _load_checkpoint(path):
    from bayesurl.training import load_checkpoint

    return load_checkpoint(path, require=("model",))


def _load_wrapper(path):
    from bayesurl.posthoc import load

    return load(path, _encoder())


def _open_cache(path):
    from bayesurl.posthoc import EmbeddingCache

    return EmbeddingCache(path.parent if path.name.endswith(".npy") else path)


def _write_idx(path):
    import struct

    data = torch.arange(2 * 28 * 28, dtype=torch.uint8).numpy().tobytes()
    path.write_bytes(struct.pack(">HBB", 0, 0x08, 3) + struct.pack(">III", 2, 28, 28) + data)


#: Public readers of a file: (name, write a valid file -> the file to damage, read it).
FILE_CASES: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "data.read_idx": (_write_idx, _read_idx),
    "training.load_checkpoint": (_write_checkpoint, _load_checkpoint),
    "posthoc.load": (_write_wrapper, _load_wrapper),
    "posthoc.EmbeddingCache": (_write_cache, _open_cache),
}


@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_missing_and_truncated_files_are_named(tmp_path, case):
    write, read = FILE_CASES[case]
    target = tmp_path / ("cache" if case.endswith("Cache") else "file.bin")
    damaged = write(target) or target
    read(target)  # the valid file reads
    raw = damaged.read_bytes()
    damaged.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match=re.escape(str(tmp_path))):
        read(target)
    damaged.unlink()
    with pytest.raises((FileNotFoundError, ValueError), match=re.escape(str(tmp_path))):
        read(target)


def _prepare_batch(device):
    from bayesurl.methods import create
    from bayesurl.training import prepare_batch

    m = create("ce", backbone="small_convnet", embed_dim=8, num_classes=C)
    return prepare_batch((torch.randn(2, 1, 28, 28), torch.arange(2)), m, device)


def _fit(device):
    from bayesurl.methods import create
    from bayesurl.training import fit

    m = create("ce", backbone="small_convnet", embed_dim=8, num_classes=C)
    return fit(m, [(torch.randn(2, 1, 28, 28), torch.arange(2))], device=device, progress=False)


def _two_view_labels(device):
    from bayesurl.losses import two_view_labels

    return two_view_labels(4, device=device)


#: Every public function with a ``device`` argument (``init_from_env`` starts a process group).
DEVICE_CASES = {
    "training.fit": _fit,
    "training.prepare_batch": _prepare_batch,
    "losses.two_view_labels": _two_view_labels,
}


@pytest.mark.parametrize("case", sorted(DEVICE_CASES))
@pytest.mark.parametrize("device", ["bogus", "cuda:x", "cuda:99"])
def test_bad_device_strings_are_named(case, device):
    with pytest.raises(ValueError, match=rf"`device` '{re.escape(device)}'"):
        DEVICE_CASES[case](device)


FUZZED = [
    (qual, fn)
    for qual, fn in public_functions()
    if not SKIP.search(qual.removeprefix("bayesurl."))
    and (kw := valid_call(qual, fn)) is not None
    and _tensors(kw)
]


@pytest.mark.parametrize(("qual", "fn"), FUZZED, ids=[q for q, _ in FUZZED])
def test_valid_example_call_runs(qual, fn):
    """The example table builds a valid call (else the fuzzer would test nothing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn(**valid_call(qual, fn))


@pytest.mark.parametrize(("qual", "fn"), FUZZED, ids=[q for q, _ in FUZZED])
def test_bad_input_is_named_or_documented(qual, fn):
    calls, failures = _fuzz(qual, fn)
    assert calls > 0
    assert not failures, "\n".join(failures)


def test_fuzzer_counts(capsys):
    """The walk covers the public surface: report its size (run with -s to see it)."""
    every = public_functions()
    calls = bad_calls()
    classes = {c for _, _, c, _ in calls}
    with capsys.disabled():
        print(
            f"\nfuzzer: {len(every)} public functions, {len(FUZZED)} fuzzed, "
            f"{len(calls)} bad calls, {len(classes) + 3} bad-input classes "
            f"({', '.join(sorted(classes))}, missing file, truncated file, bad device); "
            f"{len(FILE_CASES)} file readers, {len(DEVICE_CASES)} device arguments"
        )
    assert len(FUZZED) >= 50 and classes == set(BAD)
