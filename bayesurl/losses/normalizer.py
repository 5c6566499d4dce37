"""The vMF log-normaliser used inside ELK and nivMF: exact, or the URL code's polynomial fit.

``log C_D(kappa)`` of ``vMF(z; mu, kappa) = C_D(kappa) exp(kappa mu^T z)``. bayesurl computes
it exactly (:func:`~bayesurl.distributions.vmf.vmf_log_normalizer`). The URL
code (mkirchhof/url 9a92555, ``timm/utils/misc.py`` ``log_vmf_norm_const``, lines 57-80)
uses per-dimension fits ``a + b kappa - c kappa^p`` (made with ``approx_vmf_norm_const.R``)
for D in {4, 8, 10, 16, 32, 64, 512} and the D = 1024 fit for every ``D >= 1024``, and the
exact value for any other D. Against the exact value the fit is off by +1.11 at kappa = 1,
+0.13 at 10, -3.7 at 100 and -54 at 300 for D = 16 (-1.36, -0.08, -0.06, -23.3 for D = 64):
far outside its fit range it is not a normaliser any more, so ``"exact"`` is the default and
``"url_poly"`` an option. The code's ``nivmf_elk_sim`` calls the fit without its ``dim``
argument, i.e. at D = 10 whatever the embedding dimension (line 102 of
``timm/loss/expected_likelihood.py``); :mod:`bayesurl.losses.nivmf` reproduces that with
``normalizer="url_poly"``.
"""

from __future__ import annotations

from enum import Enum

from torch import Tensor

from bayesurl._checks import check_enum
from bayesurl.distributions.vmf import _vmf_log_normalizer

__all__ = [
    "URL_POLY_NIVMF_DIM",
    "VmfNormalizer",
    "check_normalizer",
    "log_normalizer",
    "url_poly_log_normalizer",
]

#: the dimension at which the URL code's ``nivmf_elk_sim`` evaluates the fit (its default)
URL_POLY_NIVMF_DIM = 10

# (a, b, c, p) of a + b kappa - c kappa^p, by dimension (misc.py lines 63-78)
_URL_FITS = {
    4: (-0.826604, -0.354357, 0.383723, 1.1),
    8: (-1.29737, 0.36841, 0.80936, 1.1),
    10: (-1.27184, 0.67365, 0.98726, 1.1),
    16: (-0.23773, 1.39146, 1.39819, 1.1),
    32: (8.07579, 2.28954, 1.86925, 1.1),
    64: (38.82967, 2.34269, 1.77425, 1.1),
    512: (866.3, 0.1574, 0.0236, 1.5),
    1024: (2095.0, -0.01204, 0.0007967, 1.9),
}


class VmfNormalizer(str, Enum):
    """Which ``log C_D(kappa)`` ELK / nivMF use (module docstring)."""

    #: the exact, differentiable value (default)
    EXACT = "exact"
    #: the URL code's polynomial fit
    URL_POLY = "url_poly"


def check_normalizer(normalizer: str | VmfNormalizer) -> VmfNormalizer:
    """``normalizer`` as a :class:`VmfNormalizer`; a ValueError names the valid values."""
    return check_enum(VmfNormalizer, normalizer, "normalizer")


def url_poly_log_normalizer(kappa: Tensor, dim: int) -> Tensor:
    """The URL code's fit of ``log C_D(kappa)``; the exact value where it has no fit."""
    fit = _URL_FITS.get(1024 if dim >= 1024 else dim)
    if fit is None:
        return _vmf_log_normalizer(kappa, dim)
    a, b, c, p = fit
    return a + b * kappa - c * kappa.pow(p)


def log_normalizer(
    kappa: Tensor, dim: int, normalizer: VmfNormalizer = VmfNormalizer.EXACT
) -> Tensor:
    """``log C_D(kappa)`` (float tensor ``kappa >= 0``) by the chosen :class:`VmfNormalizer`."""
    if normalizer is VmfNormalizer.URL_POLY:
        return url_poly_log_normalizer(kappa, dim)
    return _vmf_log_normalizer(kappa, dim)
