"""tinyjax.scipy.stats: `norm`, `multivariate_normal`, `bernoulli`, as jax.scipy.stats."""
from tinyjax.scipy.stats import bernoulli, multivariate_normal, norm

__all__ = ["bernoulli", "multivariate_normal", "norm"]
