"""Training: the trainer and its hooks, checkpoints, optimisers, schedules, torch.distributed.

URL (Kirchhof et al., 2023), section 4 and appendix B: LAMB, linear warm-up + cosine schedule,
gradient accumulation, two augmented views for the self-supervised methods.

>>> from bayesurl.training import Checkpointing, FitOptions, fit  # doctest: +SKIP
>>> url = FitOptions(epochs=4, optimizer="lamb", lr=1e-3, warmup_epochs=1)  # doctest: +SKIP
>>> result = fit(method, loader, url, hooks=[Checkpointing("runs/ce")])  # doctest: +SKIP
>>> from bayesurl.training import load_method_from_checkpoint  # doctest: +SKIP
>>> method = load_method_from_checkpoint("runs/ce/last.pt")  # doctest: +SKIP
"""

from bayesurl import distributed
from bayesurl.distributed import (
    DistInfo,
    all_gather_tensors,
    barrier,
    cleanup,
    init_from_env,
    is_main_process,
    wrap_ddp,
)
from bayesurl.training.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    load_checkpoint,
    load_method_from_checkpoint,
    save_checkpoint,
)
from bayesurl.training.hooks import (
    Checkpointing,
    EpochEvaluation,
    ExponentialMovingAverage,
    ProgressBar,
)
from bayesurl.training.loop import fit
from bayesurl.training.optim import (
    MultiStep,
    OptimizerName,
    WarmupCosine,
    build_optimizer,
    build_scheduler,
    even_milestones,
    multistep_factor,
    warmup_cosine_factor,
)
from bayesurl.training.options import AmpMode, FitOptions
from bayesurl.training.result import TrainResult
from bayesurl.training.seed import get_rng_state, seed_everything, set_rng_state
from bayesurl.training.trainer import Hook, Trainer, TrainPlan, prepare_batch

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "AmpMode",
    "Checkpointing",
    "EpochEvaluation",
    "ExponentialMovingAverage",
    "FitOptions",
    "Hook",
    "ProgressBar",
    "TrainPlan",
    "Trainer",
    "DistInfo",
    "MultiStep",
    "OptimizerName",
    "TrainResult",
    "WarmupCosine",
    "all_gather_tensors",
    "barrier",
    "build_optimizer",
    "build_scheduler",
    "cleanup",
    "distributed",
    "even_milestones",
    "fit",
    "get_rng_state",
    "init_from_env",
    "is_main_process",
    "load_checkpoint",
    "load_method_from_checkpoint",
    "multistep_factor",
    "prepare_batch",
    "save_checkpoint",
    "seed_everything",
    "set_rng_state",
    "warmup_cosine_factor",
    "wrap_ddp",
]
