"""tinyjax.scipy: the parts of jax.scipy that numeric programs import: `special`, `stats`, `linalg`, `signal`."""
from tinyjax.scipy import linalg, signal, special, stats

__all__ = ["linalg", "signal", "special", "stats"]
