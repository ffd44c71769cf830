"""Federated learning over Spark partitions: each client's rows stay in its own partition; each
round the driver broadcasts the global weights, sampled clients train locally, and only
parameter-shaped updates and sample counts come back (optionally clipped, noised and masked
so that the driver sees only their sum)."""
