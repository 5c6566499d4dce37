"""Small helpers on ``nn.Module`` state shared by every layer."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

__all__ = ["eval_mode"]


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """Put ``module`` in eval mode for the block; restore its training flag afterwards.

    The flag is restored also when the block raises. Like ``module.train(flag)``, the restore
    sets the flag of every submodule to the module's own.
    """
    was = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was)
