"""Heads that sit on an embedding (URL appendix B): the shared backbone ->
embedding network, the kappa MLP and class proxies of the vMF methods, and the classifier-style
heads (linear, HET-XL, SNGP, ensemble, head-only MC dropout)."""

from bayesurl.heads.classifier import LinearClassifier
from bayesurl.heads.dropout import MCDropoutHead, block_dropout_linear
from bayesurl.heads.embedding import EmbeddingNet, build_backbone
from bayesurl.heads.ensemble import (
    EnsembleHeads,
    average_log_probs,
    orthogonal_procrustes,
    pool_embeddings,
)
from bayesurl.heads.hetxl import HetXLHead, HetXLOutput, mc_softmax_log_probs
from bayesurl.heads.kappa import KappaHead, inverse_softplus
from bayesurl.heads.proxies import NonIsotropicVMFProxies, VMFProxies
from bayesurl.heads.sngp import RandomFeatureGP, SNGPOutput, mean_field_logits, spectral_normalize

__all__ = [
    "EmbeddingNet",
    "EnsembleHeads",
    "HetXLHead",
    "HetXLOutput",
    "KappaHead",
    "LinearClassifier",
    "MCDropoutHead",
    "NonIsotropicVMFProxies",
    "RandomFeatureGP",
    "SNGPOutput",
    "VMFProxies",
    "average_log_probs",
    "block_dropout_linear",
    "build_backbone",
    "inverse_softplus",
    "mc_softmax_log_probs",
    "mean_field_logits",
    "orthogonal_procrustes",
    "pool_embeddings",
    "spectral_normalize",
]
