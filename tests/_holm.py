"""Holm's step-down adjustment written from its definition (Holm, 1979), the independent
reference the statistics tests compare against."""


def holm_reference(p):
    """Adjusted p-values: the running maximum of ``min(1, (m - j) p_(j))`` in sorted order."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adj = [0.0] * m
    for rank, i in enumerate(order):
        adj[i] = max(min(1.0, (m - j) * p[order[j]]) for j in range(rank + 1))
    return adj
