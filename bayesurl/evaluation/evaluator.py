"""One entry point that evaluates any method's output (URL benchmark section 3.1, LAM section 5).

:func:`evaluate` takes plain tensors, :func:`evaluate_output` an :class:`~bayesurl.Output`.
Both return a dict with every metric that is defined for the input. The keys ``r@1``,
``r_auroc``, ``ausc``, ``ause``, ``ece``, ``ood_auroc``, ``ood_auprc`` and ``map@5`` are always
present; a metric that is not defined for the input is ``None`` and ``notes`` says why:

- no uncertainties and no samples: ``r_auroc``, ``ausc``, ``ause`` are ``None``;
- no samples: ``ece`` is ``None`` (never a made-up number from a scalar u, METRICS.md);
- no ``ood_uncertainties``: ``ood_auroc`` / ``ood_auprc`` are ``None``;
- all queries R@1-correct or all wrong (e.g. a single class): ``r_auroc`` is ``None``
  (:func:`~bayesurl.evaluation.functional.r_auroc` itself raises).

Bad input (NaN/inf, wrong dims, length mismatch, fewer than 2 points, an all-zero embedding
row, ``ood_uncertainties`` or ``reference_uncertainties`` without the uncertainties they are
compared with) raises ``ValueError`` naming the argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from bayesurl._checks import (
    check_choice,
    check_int,
    check_ints,
    check_nonzero_rows,
    check_tensor,
)
from bayesurl.distributed import Shards, raise_if_any
from bayesurl.evaluation import functional as Fm
from bayesurl.evaluation import sampled as Sm
from bayesurl.evaluation.knn import DEFAULT_MEMORY_BUDGET, _knn_sharded, knn, rank_budget
from bayesurl.types import Output

__all__ = ["REQUIRED_KEYS", "evaluate", "evaluate_output"]

#: Keys present in every result (``None`` when undefined for the input).
REQUIRED_KEYS = ("r@1", "r_auroc", "ausc", "ause", "ece", "ood_auroc", "ood_auprc", "map@5")


def _f(x: Tensor) -> float:
    return float(x.detach().cpu())


def _at_least_float32(t: Tensor) -> Tensor:
    """Half / bfloat16 inputs are evaluated in float32 (the sparse and BLAS kernels of the
    search have no half-precision CPU path, and 1/kappa_hat needs the precision)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _validate(
    embeddings: object | None,
    labels: object,
    uncertainties: object | None,
    samples: object | None,
    ood_uncertainties: object | None,
    local: bool = False,
) -> tuple[Tensor | None, Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """Checked inputs; ``local``: this rank's rows of a sharded evaluation (any count, even 0;
    the global count is checked once the shard sizes are known)."""
    s = None
    if samples is not None:
        s = check_tensor(samples, "samples", ndim=3, finite=False)  # checked with the mean
        if s.shape[0] < 1:
            raise ValueError("`samples` needs at least 1 draw, got 0")
        if not s.is_floating_point():
            raise ValueError(f"`samples` must be floating point, got {s.dtype}")
        s = _at_least_float32(s)
    x = None
    if embeddings is not None:
        x = check_tensor(embeddings, "embeddings", ndim=2, min_points=0 if local else 2)
        if not x.is_floating_point():
            raise ValueError(f"`embeddings` must be floating point, got {x.dtype}")
        x = _at_least_float32(x)
        check_nonzero_rows(x, "embeddings")
    elif s is None:
        raise ValueError("`embeddings` is required (or give `samples` to use their mean)")
    n = x.shape[0] if x is not None else s.shape[1]
    if n < 2 and not local:
        raise ValueError(f"`samples` needs at least 2 points, got {n}")
    y = check_tensor(labels, "labels", ndim=1)
    if y.shape[0] != n:
        raise ValueError(f"length mismatch: `labels` has {y.shape[0]} entries, expected {n}")
    if s is not None:
        if s.shape[1] != n:
            raise ValueError(f"length mismatch: `samples` has {s.shape[1]} points, expected {n}")
        if x is not None and s.shape[2] != x.shape[1]:
            raise ValueError(
                f"`samples` has dimension {s.shape[2]} but `embeddings` has {x.shape[1]}"
            )
    u = None
    if uncertainties is not None:
        u = check_tensor(uncertainties, "uncertainties", ndim=1)
        if u.shape[0] != n:
            raise ValueError(
                f"length mismatch: `uncertainties` has {u.shape[0]} entries, expected {n}"
            )
    v = None
    if ood_uncertainties is not None:
        v = check_tensor(
            ood_uncertainties, "ood_uncertainties", ndim=1, min_points=0 if local else 1
        )
    return x, y, u, s, v


def _prepare(
    embeddings: object | None,
    labels: object,
    uncertainties: object | None,
    samples: object | None,
    ood_uncertainties: object | None,
    local: bool,
) -> tuple[
    Tensor | None, Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None, str | None
]:
    """Validated inputs plus the draws' mean resultant and the uncertainty (and its source).

    One pass over the draws: their mean resultant (and finiteness check) serves the mean
    embedding, 1/kappa_hat, the shortlist pilot and the ECE.
    """
    x, y, u, s, v = _validate(embeddings, labels, uncertainties, samples, ood_uncertainties, local)
    res_s = None if s is None else Sm._checked_resultant(s)
    u_source = "given" if u is not None else None
    if u is None and s is not None:
        assert res_s is not None
        u = Fm._u_from_length(Fm._length(res_s), s.shape[-1])
        u_source = "1/kappa_hat from samples (Sra)"
        if not bool(torch.isfinite(u).all()):
            raise ValueError("`samples` give a non-finite 1/kappa_hat (mean resultant length 0)")
    return x, y, u, s, v, res_s, u_source


def _check_needs(
    u: Tensor | None,
    x: Tensor | None,
    res_s: Tensor | None,
    reference_uncertainties: object | None,
    ood_uncertainties: object | None,
) -> Tensor | None:
    """Refuse an option given without the input it is compared with; returns the checked
    ``reference_uncertainties``. Also refuses all-zero mean embeddings of ``samples`` (their
    direction, hence the cosine of the point search, is undefined)."""
    if x is None and res_s is not None:
        check_nonzero_rows(res_s, "samples (their mean)")
    if u is None:
        for name, value in (
            ("reference_uncertainties", reference_uncertainties),
            ("ood_uncertainties", ood_uncertainties),
        ):
            if value is not None:
                raise ValueError(
                    f"`{name}` is compared with the in-distribution uncertainties: give "
                    "`uncertainties` (or `samples`) too"
                )
    if reference_uncertainties is None:
        return None
    ref = check_tensor(reference_uncertainties, "reference_uncertainties", ndim=1)
    if u is not None and ref.shape[0] != u.shape[0]:
        raise ValueError(
            f"length mismatch: `reference_uncertainties` has {ref.shape[0]} entries, "
            f"`uncertainties` {u.shape[0]}"
        )
    return ref


def evaluate(
    embeddings: Tensor | None,
    labels: Tensor,
    *,
    uncertainties: Tensor | None = None,
    samples: Tensor | None = None,
    ood_uncertainties: Tensor | None = None,
    reference_uncertainties: Tensor | None = None,
    ks: Sequence[int] = (1, 5, 10),
    map_ks: Sequence[int] | None = None,
    n_bins: int = 10,
    ece_mode: str = "shortlist",
    shortlist: int | None = None,
    tolerance: float = 1e-3,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    backend: str = "torch",
    return_curves: bool = False,
    progress: bool = False,
    distributed: bool = False,
    group: dist.ProcessGroup | None = None,
    reference: str | None = None,
    copy: bool = True,
) -> dict[str, Any]:
    """Every retrieval and uncertainty metric defined for the input, from one kNN search.

    With ``distributed=True`` (under an initialised ``torch.distributed`` process group, e.g.
    ``torchrun``) the evaluation is sharded (issue 16): every array argument holds **this
    rank's rows** (contiguous shards in rank order, e.g. :func:`bayesurl.distributed.shard_range`;
    a rank may hold none), each rank searches its queries over every rank's rows passed by in
    bounded chunks (:func:`~bayesurl.evaluation.knn_sharded`; no rank holds all ``N x D``),
    the sampling-aware ECE shards its pilot, threshold pass and per-draw products the same way,
    and the per-query results (neighbour ids, labels, u) are gathered, so every rank returns
    the metrics of the single-process evaluation of the concatenated rows, ties included. One
    process is the ``W = 1`` case of the same code.

    Parameters
    ----------
    embeddings : Tensor or None
        ``[N, D]`` point embeddings (cosine similarity). ``None`` with ``samples`` uses the
        normalised mean of the normalised samples (METRICS.md, "Sampling-aware evaluation").
    labels : Tensor
        ``[N]`` class labels.
    uncertainties : Tensor, optional
        ``[N]`` u (higher = less certain). Defaults to ``1 / kappa_hat`` (Sra's approximation)
        when ``samples`` are given.
    samples : Tensor, optional
        ``[S, N, D]`` posterior draws; enable the retrieval ECE (LAM, section 5).
    ood_uncertainties : Tensor, optional
        ``[M]`` u of out-of-distribution inputs; enable OOD AUROC / AUPRC. Needs
        ``uncertainties`` or ``samples`` (refused without them).
    reference_uncertainties : Tensor, optional
        ``[N]`` ground-truth uncertainty; adds ``rank_correlation`` (Spearman, URL App. C.3).
        Needs ``uncertainties`` or ``samples`` (refused without them).
    ks : sequence of int
        Cut-offs of ``recall@k``; one kNN search with ``max(ks)`` neighbours serves all.
    map_ks : sequence of int, optional
        Cut-offs of ``map@k`` (default: ``ks``); ``map@5`` is always computed.
    n_bins : int
        ECE bins.
    ece_mode : {"shortlist", "exact"}
        Per-draw 1-NN search of the ECE, see
        :func:`~bayesurl.evaluation.sampled.sampled_neighbors`.
    shortlist : int, optional
        Shortlist length L of the sampling-aware search; ``None`` chooses it from a pilot so
        the estimated miss rate is at most ``tolerance``
        (:func:`~bayesurl.evaluation.sampled.choose_shortlist`).
    tolerance : float
        Miss-rate target of the adaptive shortlist.
    memory_budget : int
        Bytes per similarity chunk of one process; with ``distributed`` each of the ``W``
        ranks uses ``memory_budget // W`` (:func:`~bayesurl.evaluation.rank_budget`).
    backend : {"torch", "faiss"}
        kNN backend of the deterministic pass.
    return_curves : bool
        Also return ``sparsification`` (removed fraction, R@1 curve, oracle curve) and
        ``reliability`` (bin edges, confidence, accuracy, count) as lists.
    progress : bool
        Show tqdm bars over the ECE draws.
    distributed : bool
        Shard over the ranks of ``group`` (collective: every rank must call). Needs
        ``backend="torch"``; ``ood_uncertainties`` and ``reference_uncertainties`` are per-rank
        shards too.
    group : ProcessGroup, optional
        Process group of ``distributed`` (default: the default group).
    reference : {None, "lam"}
        ``"lam"`` also reports the AUSC and ECE as the LAM authors' code computes them
        (:mod:`bayesurl.evaluation.lam_reference`: pair uncertainty from the per-dimension
        std of the draws, 99 trapezoid levels; ECE bins ``[lo, hi)`` that drop confidence
        1.0) under the extra keys ``lam_ausc`` and ``lam_ece`` (``samples`` required, else
        ``None`` with a note). bayesurl's own ``ausc`` / ``ece`` are unchanged.
    copy : bool
        ``False`` lets the search L2-normalise ``embeddings`` in place instead of a normalised
        copy (scikit-learn's ``copy=False``): one ``[N, D]`` tensor (this rank's ``[n_r, D]``)
        less at the peak, for a caller that owns the array and does not need it afterwards --
        ``bayesurl evaluate INPUT.npz`` passes it. The values of ``embeddings`` are
        overwritten (float32 and float64 inputs; other dtypes are converted, so never
        overwritten); the metrics are the same bit for bit.

    Returns
    -------
    dict
        ``r@1``, ``r_auroc``, ``ausc``, ``ause``, ``ece``, ``ood_auroc``, ``ood_auprc``,
        ``map@5`` (float or None), ``recall@k`` and ``map@k`` for the requested cut-offs,
        ``rank_correlation``, ``n``, ``uncertainty_source`` and ``notes`` (list of str).

    Examples
    --------
    >>> import torch
    >>> x, y = torch.randn(50, 8), torch.arange(50) % 5
    >>> res = evaluate(x, y, uncertainties=torch.rand(50))
    >>> sorted(k for k in res if k in REQUIRED_KEYS) == sorted(REQUIRED_KEYS)
    True
    """
    if reference not in (None, "lam"):
        raise ValueError(f"`reference` must be None or 'lam', got {reference!r}")
    if not isinstance(copy, bool):
        raise ValueError(f"`copy` must be True or False, got {copy!r}")
    if reference is not None and distributed:
        raise ValueError("`reference='lam'` needs every draw on one process; not with distributed")
    if distributed and not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "`distributed=True` needs an initialised torch.distributed process group "
            "(run under torchrun, or call bayesurl.distributed.init_from_env())"
        )
    if group is not None and not distributed:
        raise ValueError("`group` is only used with `distributed=True`")
    if distributed and backend != "torch":
        raise ValueError(f"`distributed=True` needs backend='torch', got {backend!r}")
    # integers only: ks=(2.7,) used to report recall@2
    ks = check_ints(ks, "ks", low=1)
    map_ks = tuple(
        sorted({*ks, 5} if map_ks is None else {*check_ints(map_ks, "map_ks", low=1), 5})
    )
    check_choice(ece_mode, "ece_mode", ("shortlist", "exact"))
    if shortlist is not None:
        shortlist = check_int(shortlist, "shortlist", low=1)
    try:  # this rank's input; under torch.distributed every rank learns of any rank's error
        x, y, u, s, v, res_s, u_source = _prepare(
            embeddings, labels, uncertainties, samples, ood_uncertainties, local=distributed
        )
        ref_u = _check_needs(u, x, res_s, reference_uncertainties, ood_uncertainties)
        error = None
    except ValueError as exc:
        if not distributed:
            raise
        error = exc
    if distributed:
        raise_if_any(error, group)
    notes: list[str] = []
    res: dict[str, Any] = dict.fromkeys(REQUIRED_KEYS)
    mean_emb = None if res_s is None else Fm.normalize(res_s)
    if x is None:
        x = mean_emb
    assert x is not None
    n_loc = x.shape[0]
    sh = Shards.of(n_loc, x.device, group) if distributed else Shards.local(n_loc)
    n = sh.n
    if n < 2:
        raise ValueError(f"`embeddings` needs at least 2 points over all ranks, got {n}")
    if sh.active:  # the shards must describe one data set
        dims = torch.tensor([[x.shape[1], 0 if s is None else s.shape[0]]], device=x.device)
        every = sh.gather(dims)
        if bool((every != every[:1]).any()):
            raise ValueError(
                "the ranks disagree on the embedding dimension / number of draws (rank: [D, S]):"
                f" {every.tolist()}"
            )
    res["n"] = n
    res["uncertainty_source"] = u_source
    # each of the W ranks holds 1/W of one process's similarity blocks (issue 16)
    memory_budget = rank_budget(memory_budget, sh)

    # One search of the point embeddings serves R@k, mAP@k and, when the samples' mean is the
    # point embedding, the ECE shortlist.
    share = s is not None and ece_mode == "shortlist" and mean_emb is x
    ece_info: dict[str, float] = {}
    if share and shortlist is None:
        assert s is not None and res_s is not None
        shortlist, ece_info = Sm._choose_shortlist(
            s, res_s, tolerance=tolerance, memory_budget=memory_budget, shards=sh
        )
        if ece_info["miss_rate"] > tolerance:
            # no affordable shortlist keeps the per-draw neighbours exact enough: search each
            # draw exactly rather than report an ECE from wrong neighbours
            notes.append(
                f"ece: the largest shortlist ({shortlist}) misses an estimated "
                f"{ece_info['miss_rate']:.2%} of per-draw neighbours (> tolerance {tolerance}); "
                "searched every draw exactly"
            )
            ece_mode, share, shortlist, ece_info = "exact", False, None, {}
    k_search = min(max([*ks, *map_ks, 1] + ([shortlist] if share and shortlist else [])), n - 1)
    if backend == "torch":  # this rank's queries over every rank's rows (global ids)
        # copy=False: the embeddings are not read after the search, normalise them in place
        # (given embeddings only: the samples' mean is read again by the ECE)
        inplace = not copy and embeddings is not None
        _, nb_loc = _knn_sharded(
            x, k_search, sh, memory_budget, None, inplace=inplace, exact_values=False
        )
    else:
        _, nb_loc = knn(x, k_search, memory_budget=memory_budget, backend=backend)
    # The neighbour ids stay on their rank: each rank scores its own queries against the labels
    # of every row, and only per-query scalars are gathered (hit flags, AP@k) -- no [N, k] ids
    # on every rank and no rank repeating another's work; the means over the gathered [N]
    # columns are the single-process ones, bit for bit (the identity in one process).
    dev = nb_loc.device
    y_loc = y.to(dev)
    y_dev = sh.gather(y_loc)  # [N] labels of every row
    if u is not None:
        u = sh.gather(u.to(dev))
    hit = y_dev[nb_loc] == y_loc[:, None]  # [n_r, k_search]
    rec_ks = [k for k in ks if k <= n - 1]
    map_ok = [k for k in map_ks if k <= n - 1]
    flags = sh.gather(torch.stack([hit[:, 0], *(hit[:, :k].any(dim=1) for k in rec_ks)], dim=1))
    mates = Fm._class_mates(y_dev)[sh.offset : sh.offset + n_loc]
    aps = sh.gather(
        torch.stack([Fm._ap_from_hits(hit, mates, k) for k in map_ok], dim=1)
        if map_ok
        else torch.empty(n_loc, 0, dtype=torch.float64, device=dev)
    )
    correct = flags[:, 0].contiguous()
    res["r@1"] = _f(correct.double().mean())
    for k in ks:
        if k > n - 1:
            res[f"recall@{k}"] = None
            notes.append(f"recall@{k}: undefined with only {n} points")
        else:
            res[f"recall@{k}"] = _f(flags[:, 1 + rec_ks.index(k)].contiguous().double().mean())
    for k in map_ks:
        if k > n - 1:
            res[f"map@{k}"] = None
            notes.append(f"map@{k}: undefined with only {n} points")
        else:
            res[f"map@{k}"] = _f(aps[:, map_ok.index(k)].contiguous().mean())
    if u is None:
        notes.append("r_auroc, ausc, ause: no uncertainties (give `uncertainties` or `samples`)")
    else:
        u = u.to(correct.device)
        try:
            res["r_auroc"] = _f(Fm.r_auroc(u, correct))
        except ValueError as exc:
            notes.append(f"r_auroc: {exc}")
        removed, curve = Fm.sparsification_curve(u, correct)
        oracle = Fm.oracle_curve(correct)
        res["ausc"] = _f(curve.mean())
        res["ause"] = _f((oracle - curve).mean())
        if return_curves:
            res["sparsification"] = {
                "removed": removed.tolist(),
                "r@1": curve.tolist(),
                "oracle": oracle.tolist(),
            }
        if ref_u is not None:
            res["rank_correlation"] = _f(Fm.rank_correlation(u, sh.gather(ref_u.to(u.device))))

    if s is None:
        notes.append("ece: no samples (ECE needs posterior draws; docs: Concepts > Metrics)")
    else:
        Fm._check_n_bins(n_bins)  # before the search, not after it
        nb_draws = Sm._sampled_neighbors(
            s, mode=ece_mode, shortlist=shortlist, candidates=nb_loc if share else None,
            tolerance=tolerance, margin=ece_info.get("margin") if share else None,
            memory_budget=memory_budget, info=ece_info, progress=progress, block=32,
            cluster_iters=4, resultant=res_s, shards=sh,
        )  # fmt: skip
        nb_draws = sh.gather(nb_draws.T.contiguous()).T  # [S, N] global ids
        ece = Fm._ece_from_neighbors(nb_draws, y_dev.to(s.device), s.shape[0], n_bins)
        res["ece"] = _f(ece.ece)
        if ece_mode == "shortlist":
            res["ece_shortlist"] = int(ece_info["shortlist"])
            if "miss_rate" in ece_info:
                res["ece_shortlist_miss_rate"] = ece_info["miss_rate"]
            if "kept_per_query" in ece_info:
                res["ece_candidates_per_query"] = ece_info["kept_per_query"]
        if return_curves:
            res["reliability"] = {
                "bin_edges": ece.bin_edges.tolist(),
                "confidence": ece.bin_confidence.tolist(),
                "accuracy": ece.bin_accuracy.tolist(),
                "count": ece.bin_count.tolist(),
            }

    if v is None:
        notes.append("ood_auroc, ood_auprc: no `ood_uncertainties`")
    else:
        v = sh.gather(v.to(u.device))
        if v.numel() == 0:
            raise ValueError("`ood_uncertainties` is empty on every rank")
        res["ood_auroc"] = _f(Fm.ood_auroc(u, v))
        res["ood_auprc"] = _f(Fm.ood_auprc(u, v))
    res.setdefault("rank_correlation", None)
    if reference == "lam":
        _lam_reference(res, s, y, n_bins, notes)
    res["notes"] = notes
    return res


def _lam_reference(
    res: dict[str, Any], s: Tensor | None, y: Tensor, n_bins: int, notes: list[str]
) -> None:
    """Add the LAM-code ``lam_ausc`` / ``lam_ece`` (named variants, LAM section 5)."""
    if s is None:
        res["lam_ausc"] = res["lam_ece"] = None
        notes.append("lam_ausc, lam_ece: the LAM-code variants need `samples`")
        return
    from bayesurl.evaluation.lam_reference import lam_ausc, lam_ece

    sigma = s.std(dim=0)
    res["lam_ausc"] = lam_ausc(s.mean(dim=0), sigma, y.to(s.device))
    res["lam_ece"] = lam_ece(s, y.to(s.device), n_bins)


def evaluate_output(
    output: Output,
    labels: Tensor,
    ood_output: Output | None = None,
    *,
    n_samples: int = 32,
    seed: int = 0,
    **kwargs: Any,
) -> dict[str, Any]:
    """:func:`evaluate` on a method's :class:`~bayesurl.Output` (ARCHITECTURE.md data path).

    Uses ``output.embedding``, ``output.uncertainty`` and ``output.samples``. A method that
    predicts a vMF concentration (``output.kappa``) but returns no samples gets ``n_samples``
    vMF draws from a fixed generator (``seed``) so its ECE is defined (METRICS.md, ECE).

    Parameters
    ----------
    output : Output
        In-distribution output.
    labels : Tensor
        ``[N]`` class labels.
    ood_output : Output, optional
        Output on OOD inputs; its ``uncertainty`` feeds ``ood_auroc`` / ``ood_auprc``.
    n_samples : int
        Draws taken from ``kappa`` when ``output.samples`` is None (0 disables).
    seed : int
        Seed of the fixed generator for those draws.
    **kwargs
        Passed on to :func:`evaluate`.

    Returns
    -------
    dict
        As :func:`evaluate`.
    """
    if not isinstance(output, Output):
        raise ValueError(f"`output` must be a bayesurl.Output, got {type(output).__name__}")
    if ood_output is not None and not isinstance(ood_output, Output):
        raise ValueError(f"`ood_output` must be a bayesurl.Output, got {type(ood_output).__name__}")
    out = output.detach()
    samples = out.samples
    if samples is None and out.kappa is not None and n_samples > 0:
        from bayesurl.distributions import sample_vmf

        emb = check_tensor(out.embedding, "output.embedding", ndim=2)
        kappa = check_tensor(out.kappa, "output.kappa", ndim=1)
        gen = torch.Generator(device=emb.device).manual_seed(seed)
        samples = sample_vmf(emb, kappa, n_samples, generator=gen)
    return evaluate(
        out.embedding,
        labels,
        uncertainties=out.uncertainty,
        samples=samples,
        ood_uncertainties=None if ood_output is None else ood_output.detach().uncertainty,
        **kwargs,
    )
