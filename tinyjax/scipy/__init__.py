"""tinyjax.scipy: the parts of jax.scipy that numeric programs import: `special`, `stats`, `linalg`, `signal`."""
from tinyjax.scipy import linalg, special, stats

__all__ = ["linalg", "special", "stats"]
