"""Evaluation of personalized and global models, aggregated over clients."""

from pfl.metrics.evaluate import evaluate_federation, mean_std

__all__ = ["evaluate_federation", "mean_std"]
