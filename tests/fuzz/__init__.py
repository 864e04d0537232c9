"""Random `tinyjax.numpy` programs checked against a float64 numpy reference with JAX's dtype rules (see programs.py);
`python -m tests.fuzz` runs them from the command line."""
