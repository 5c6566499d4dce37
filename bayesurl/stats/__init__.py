"""Statistics of one evaluation's numbers: the interval each metric declares over the queries
(Wilson, DeLong, Fisher-z, Boyd's logit, the Poisson bootstrap), the weighted statistics the
bootstrap recomputes, and the paired bootstrap of two estimators on the same queries
(:mod:`bayesurl.stats.intervals`; docs/concepts/metrics.rst, "Intervals")."""

from bayesurl.stats.intervals import (
    DEFAULT_LEVEL,
    DEFAULT_REPLICATES,
    Interval,
    IntervalMethod,
    paired_bootstrap,
)

__all__ = ["DEFAULT_LEVEL", "DEFAULT_REPLICATES", "Interval", "IntervalMethod", "paired_bootstrap"]
