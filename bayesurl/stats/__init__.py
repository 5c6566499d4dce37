"""Statistics behind every number a user reads.

- :mod:`bayesurl.stats.intervals`: one evaluation's numbers -- the interval each metric
  declares over the queries (Wilson, DeLong, Fisher-z, Boyd's logit, the Poisson bootstrap),
  the weighted statistics the bootstrap recomputes, and the paired bootstrap of two
  estimators on the same queries (docs/concepts/metrics.rst, "Intervals");
- :mod:`bayesurl.stats.comparison`: repeated runs -- t- and bootstrap intervals of a mean,
  t / Wilcoxon tests against a value, Holm's adjustment, split-half Spearman.
"""

from bayesurl.stats.intervals import (
    DEFAULT_LEVEL,
    DEFAULT_REPLICATES,
    Interval,
    IntervalMethod,
    paired_bootstrap,
)

__all__ = ["DEFAULT_LEVEL", "DEFAULT_REPLICATES", "Interval", "IntervalMethod", "paired_bootstrap"]
