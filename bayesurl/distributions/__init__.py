"""Distributions on embeddings: the von Mises-Fisher distribution (exact log-normaliser,
Wood sampler) used by MCInfoNCE, ELK, nivMF, HIB, credible intervals and the evaluator, and the
low-rank plus diagonal Gaussian of HET-XL."""

from bayesurl.distributions.lowrank_gaussian import LowRankGaussian
from bayesurl.distributions.vmf import (
    VonMisesFisher,
    kappa_from_resultant_length,
    log_bessel_iv,
    sample_vmf,
    vmf_cosine_grad_kappa,
    vmf_log_normalizer,
    vmf_mean_resultant_length,
)

__all__ = [
    "LowRankGaussian",
    "VonMisesFisher",
    "kappa_from_resultant_length",
    "log_bessel_iv",
    "sample_vmf",
    "vmf_cosine_grad_kappa",
    "vmf_log_normalizer",
    "vmf_mean_resultant_length",
]
