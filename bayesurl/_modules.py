"""Small helpers on ``nn.Module`` state shared by every layer."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["device_of", "eval_mode"]


def device_of(module: nn.Module, default: torch.device | str = "cpu") -> torch.device:
    """The device of ``module``'s first parameter, else of its first buffer, else ``default``
    (a stateless module runs wherever its inputs are)."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device(default)


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
