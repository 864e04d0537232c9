"""tinyjax.experimental: the names JAX keeps under `jax.experimental` that programs still import from there."""
