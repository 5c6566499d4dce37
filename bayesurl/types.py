"""The one data type every method, Laplace head and post-hoc wrapper returns."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

__all__ = ["Output"]


@dataclass
class Output:
    """Embedding and uncertainty of a batch of inputs.

    Attributes
    ----------
    embedding : Tensor
        ``[N, D]`` point embedding e(x). Retrieval compares L2-normalised embeddings by cosine
        similarity, whatever the training distance (docs/concepts/metrics.rst).
    uncertainty : Tensor
        ``[N]`` u(x); higher means *less* certain for every method (``1/kappa`` for vMF
        methods, ``tau`` for temperatures, entropy for classifiers).
    logits : Tensor or None
        ``[N, C]`` class logits where the method has a classifier.
    samples : Tensor or None
        ``[S, N, D]`` draws from the method's embedding distribution, when asked for.
    kappa : Tensor or None
        ``[N]`` vMF concentration for methods that predict one (lets losses and samplers use it
        without inverting ``uncertainty``).
    """

    embedding: Tensor
    uncertainty: Tensor
    logits: Tensor | None = None
    samples: Tensor | None = None
    kappa: Tensor | None = None

    def to(self, *args, **kwargs) -> Output:
        """Move every tensor field like :meth:`torch.Tensor.to`."""
        return Output(
            **{
                f.name: (v.to(*args, **kwargs) if isinstance(v, Tensor) else v)
                for f in fields(self)
                for v in [getattr(self, f.name)]
            }
        )

    def detach(self) -> Output:
        """Detach every tensor field from the autograd graph."""
        return Output(
            **{
                f.name: (v.detach() if isinstance(v, Tensor) else v)
                for f in fields(self)
                for v in [getattr(self, f.name)]
            }
        )

    @staticmethod
    def cat(outputs: list[Output]) -> Output:
        """Concatenate batches along N (``samples`` along dim 1)."""
        if not outputs:
            raise ValueError("`outputs` is empty")
        out = {}
        for f in fields(Output):
            vals = [getattr(o, f.name) for o in outputs]
            if all(v is None for v in vals):
                out[f.name] = None
            elif any(v is None for v in vals):
                raise ValueError(f"field `{f.name}` is None in some batches but not in others")
            else:
                out[f.name] = torch.cat(vals, dim=1 if f.name == "samples" else 0)
        return Output(**out)
