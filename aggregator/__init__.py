"""aggregator: a Kubernetes API aggregation gateway."""

__version__ = "0.1.0"
