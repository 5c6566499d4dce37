"""Distributions on embeddings: the von Mises-Fisher distribution (exact log-normaliser,
Wood sampler) used by MCInfoNCE, ELK, nivMF, HIB, credible intervals and the evaluator, and the
low-rank plus diagonal Gaussian of HET-XL, and Gaussians fitted to reference features
(class-conditional or k-means components, Ledoit-Wolf shrinkage, Cholesky factors) behind the
Mahalanobis and feature-density scores."""

from bayesurl.distributions.gaussian_mixture import (
    GaussianMixture,
    fit_gaussians,
    kmeans,
    ledoit_wolf_shrinkage,
    shrunk_covariance,
)
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
    "GaussianMixture",
    "LowRankGaussian",
    "VonMisesFisher",
    "fit_gaussians",
    "kappa_from_resultant_length",
    "kmeans",
    "ledoit_wolf_shrinkage",
    "log_bessel_iv",
    "sample_vmf",
    "shrunk_covariance",
    "vmf_cosine_grad_kappa",
    "vmf_log_normalizer",
    "vmf_mean_resultant_length",
]
