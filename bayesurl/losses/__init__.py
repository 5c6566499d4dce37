"""Losses of the URL methods (URL appendix B), LAM's contrastive loss and TaU-SimCLR.

The metric losses are pytorch-metric-learning ``BaseMetricLossFunction`` subclasses that take the
vMF concentration explicitly, each with a functional core on plain tensors (usable outside PML's
contract, e.g. in the MCInfoNCE controlled experiment)."""

from bayesurl.losses._base import ExplicitKappaLoss, contrastive_log_ratio
from bayesurl.losses.contrastive import ContrastiveLoss
from bayesurl.losses.elk import (
    ELKLoss,
    elk_contrastive_loss,
    elk_log_kernel,
    elk_pairwise_log_kernel,
    elk_proxy_loss,
)
from bayesurl.losses.hib import HIBLoss, hib_log_match_probability, hib_loss
from bayesurl.losses.infonce import InfoNCELoss, infonce_loss, two_view_labels
from bayesurl.losses.losspred import LossPredictionLoss, LossPredictor, losspred_loss
from bayesurl.losses.mcinfonce import MCInfoNCELoss, mcinfonce_loss
from bayesurl.losses.nivmf import NivMFLoss, nivmf_elk_logits, nivmf_log_density, nivmf_loss
from bayesurl.losses.tau import TaULoss, TaUVariant, tau_simclr_loss

__all__ = [
    "ContrastiveLoss",
    "ELKLoss",
    "LossPredictionLoss",
    "LossPredictor",
    "TaULoss",
    "TaUVariant",
    "losspred_loss",
    "tau_simclr_loss",
    "ExplicitKappaLoss",
    "HIBLoss",
    "InfoNCELoss",
    "MCInfoNCELoss",
    "NivMFLoss",
    "contrastive_log_ratio",
    "elk_contrastive_loss",
    "elk_log_kernel",
    "elk_pairwise_log_kernel",
    "elk_proxy_loss",
    "hib_log_match_probability",
    "hib_loss",
    "infonce_loss",
    "mcinfonce_loss",
    "nivmf_elk_logits",
    "nivmf_log_density",
    "nivmf_loss",
    "two_view_labels",
]
