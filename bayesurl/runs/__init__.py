"""Runs and sweeps: storage of a sweep's runs (:mod:`bayesurl.runs.storage`) and aggregation of
their records (:mod:`bayesurl.runs.aggregate`)."""
