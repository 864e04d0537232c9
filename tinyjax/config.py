"""Global configuration, as `jax.config`: `config.update("jax_enable_x64", True)`, `config.jax_enable_x64`."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any


def _env_flag(name: str) -> bool:
  return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class Config:
  """Named options with typed values. Read as attributes or with `read`, change with `update` or `override`.

  Options (name: type, default):
    jax_enable_x64: bool, False unless the environment variable JAX_ENABLE_X64 is 1/true.
    jax_debug_nans: bool, False.
    jax_platforms: str or None, None (e.g. "cpu", "cuda", "cpu,cuda").
    jax_compilation_cache_dir: str or None, None.
    jax_num_cpu_devices: int, -1: how many CPU devices `devices("cpu")` lists (-1: the environment variable
      TINYJAX_CPU_DEVICES, else 1). They share the host's memory and thread pool (devices/device.py).
  """

  # name -> (accepted types, default). None in the types means the option may be unset.
  _options: dict[str, tuple[tuple[type | None, ...], Any]] = {
    "jax_enable_x64": ((bool,), False),
    "jax_debug_nans": ((bool,), False),
    "jax_platforms": ((str, None), None),
    "jax_compilation_cache_dir": ((str, None), None),
    "jax_num_cpu_devices": ((int,), -1),
  }

  def __init__(self) -> None:
    values = {name: default for name, (_, default) in self._options.items()}
    if "JAX_ENABLE_X64" in os.environ:
      values["jax_enable_x64"] = _env_flag("JAX_ENABLE_X64")
    object.__setattr__(self, "_values", values)
    object.__setattr__(self, "_callbacks", [])
    # each option's value is also a plain attribute, so that `config.jax_enable_x64` (read on many eager operations)
    # is an attribute lookup, not a __getattr__ call (~0.5 us); `update` keeps both in step
    for name, value in values.items(): object.__setattr__(self, name, value)

  def __getattr__(self, name: str) -> Any:
    # Only called when normal lookup fails (an option is an attribute): an unknown name.
    if name.startswith("_"):
      raise AttributeError(name)
    return self.read(name)

  def __setattr__(self, name: str, value: Any) -> None:
    raise AttributeError(f"Use config.update({name!r}, value) to change a config option")

  def _check_name(self, name: str) -> None:
    if name not in self._options:
      raise AttributeError(f"Unrecognized config option: {name}")

  def read(self, name: str) -> Any:
    """Returns the current value of the option `name`; AttributeError if there is no such option."""
    self._check_name(name)
    return self._values[name]

  def update(self, name: str, value: Any) -> None:
    """Sets option `name` to `value` and calls the registered change callbacks if the value changed.

    Raises AttributeError for an unknown name and TypeError for a value of the wrong type.
    """
    self._check_name(name)
    types, _ = self._options[name]
    valid = (value is None and None in types) or any(
      typ is not None and isinstance(value, typ) for typ in types)
    if not valid:
      names = " or ".join("None" if typ is None else typ.__name__ for typ in types)
      raise TypeError(f"Config option {name} expects a value of type {names}, got {type(value).__name__}: {value!r}")
    old = self._values[name]
    self._values[name] = value
    object.__setattr__(self, name, value)
    if old != value:
      for callback in list(self._callbacks):
        callback(name, value)

  def on_change(self, callback: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
    """Registers `callback(name, new_value)`, called after any option changes value. Returns `callback`.

    Caches keyed on config values (e.g. on jax_enable_x64) use this to clear themselves.
    """
    self._callbacks.append(callback)
    return callback

  @contextlib.contextmanager
  def override(self, name: str, value: Any) -> Iterator[None]:
    """Context manager: sets option `name` to `value` inside the block and restores the old value on exit."""
    old = self.read(name)
    self.update(name, value)
    try:
      yield
    finally:
      self.update(name, old)

  def values(self) -> dict[str, Any]:
    """Returns a copy of all options and their current values."""
    return dict(self._values)

  def config_with_absl(self) -> None:
    """As JAX's: define an absl command-line flag per option (`--jax_enable_x64`, ...), so that `absl.app.run`
    sets the options from the command line. Needs absl-py."""
    from absl import flags
    for name, (types, _) in self._options.items():
      if name in flags.FLAGS: continue
      current = self._values[name]
      if bool in types: flags.DEFINE_bool(name, current, f"tinyjax config option {name}")
      elif int in types: flags.DEFINE_integer(name, current, f"tinyjax config option {name}")
      else: flags.DEFINE_string(name, current, f"tinyjax config option {name}")
      flags.register_validator(name, lambda value, name=name: self.update(name, value) is None)

  def parse_flags_with_absl(self) -> None:
    """As JAX's: set the options from the `--jax_*` flags of sys.argv now, without `absl.app.run`."""
    import sys

    from absl import flags
    self.config_with_absl()
    if not flags.FLAGS.is_parsed():
      flags.FLAGS([sys.argv[0], *(arg for arg in sys.argv[1:] if arg.lstrip("-").split("=")[0] in self._options)],
                  known_only=True)


config = Config()


def debug_nans(value: bool = True) -> contextlib.AbstractContextManager:
  """`with tinyjax.debug_nans(True):` sets jax_debug_nans inside the block (JAX's context manager)."""
  return config.override("jax_debug_nans", bool(value))


def _sync_debug_nans(name: str, value: Any) -> None:
  """Keep the trace machinery's jax_debug_nans switch (a plain list read on every eager op) in step."""
  if name == "jax_debug_nans":
    from tinyjax.trace.core import debug_nans
    debug_nans[0] = bool(value)


config.on_change(_sync_debug_nans)
