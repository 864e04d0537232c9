"""tinyjax.example_libraries: JAX's small example libraries, `optimizers` (init/update/get_params triples) and `stax`
(layers as (init_fun, apply_fun) pairs), so that programs written against `jax.example_libraries` run unchanged."""
