"""Reproductions of the papers' experiments (see :mod:`bayesurl.experiments.controlled`)."""
