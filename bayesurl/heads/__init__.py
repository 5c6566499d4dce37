"""Heads that sit on an embedding: classifiers, HET-XL, SNGP, ensembles, MC dropout, and the
shared backbone -> embedding network (spec ARCHITECTURE.md, URL appendix B)."""

from bayesurl.heads.classifier import LinearClassifier
from bayesurl.heads.dropout import MCDropoutHead
from bayesurl.heads.ensemble import EnsembleHeads, average_log_probs
from bayesurl.heads.hetxl import HetXLHead, HetXLOutput, mc_softmax_log_probs
from bayesurl.heads.sngp import RandomFeatureGP, SNGPOutput, mean_field_logits, spectral_normalize

# PLACEHOLDER (to reconcile on merge): the vMF helper's heads also belong here --
#   from bayesurl.heads.embedding import EmbeddingNet, build_backbone
#   from bayesurl.heads.kappa import KappaHead
#   from bayesurl.heads.proxies import ...   (class proxies, isotropic / non-isotropic)
# and their names in __all__.

__all__ = [
    "EnsembleHeads",
    "HetXLHead",
    "HetXLOutput",
    "LinearClassifier",
    "MCDropoutHead",
    "RandomFeatureGP",
    "SNGPOutput",
    "average_log_probs",
    "mc_softmax_log_probs",
    "mean_field_logits",
    "spectral_normalize",
]
