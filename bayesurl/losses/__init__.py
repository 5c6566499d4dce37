"""Losses of the URL methods (URL appendix B): pytorch-metric-learning ``BaseMetricLossFunction``
subclasses that take the vMF concentration explicitly, each with a functional core on plain
tensors (usable outside PML's contract, e.g. in the MCInfoNCE controlled experiment)."""

from bayesurl.losses._base import ExplicitKappaLoss, contrastive_log_ratio
from bayesurl.losses.infonce import InfoNCELoss, infonce_loss, two_view_labels
from bayesurl.losses.mcinfonce import MCInfoNCELoss, mcinfonce_loss

__all__ = [
    "ExplicitKappaLoss",
    "InfoNCELoss",
    "MCInfoNCELoss",
    "contrastive_log_ratio",
    "infonce_loss",
    "mcinfonce_loss",
    "two_view_labels",
]
