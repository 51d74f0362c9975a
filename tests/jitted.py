"""Library functions called through ``jax.jit`` in tests, one program a call.

A loss called eagerly dispatches (and, for each new shape, compiles) every
primitive on its own; with the suite's XLA settings a NumPy-comparison test
of a few losses spent most of its time there (test_moon_edge_cases: 4.6 s
eager against 1.5 s jitted, measured). ``jitted_module(losses)`` gives the
same functions, each call traced once as one program: arrays are traced,
every other argument (forms, flags, temperatures, None) is static. Numerics
are those of the library's own jitted use; errors raised while tracing still
reach the test.
"""

import functools
import types

import jax
import numpy as np


def _is_array(value):
  """An array, or a container (dict, list, tuple) of nothing but arrays:
  traced. Anything else (strings, numbers, None, shapes) is static."""
  if isinstance(value, (np.ndarray, jax.Array)):
    return True
  if not isinstance(value, (dict, list, tuple)):
    return False
  return all(
    isinstance(leaf, (np.ndarray, jax.Array)) for leaf in jax.tree.leaves(value)
  )


@functools.lru_cache(maxsize=None)
def _compiled(fn, static_positions, static_items, array_names):
  def call(*arrays):
    args, it = [], iter(arrays)
    positions = dict(static_positions)
    for index in range(len(arrays) - len(array_names) + len(positions)):
      args.append(positions[index] if index in positions else next(it))
    kwargs = dict(static_items)
    kwargs.update(zip(array_names, it))
    return fn(*args, **kwargs)

  return jax.jit(call)


def _hashable(value):
  try:
    hash(value)
  except TypeError:
    return False
  return True


def jitted(fn):
  """``fn`` with each call run as one jitted program (see module doc)."""

  @functools.wraps(fn)
  def call(*args, **kwargs):
    static = [(i, a) for i, a in enumerate(args) if not _is_array(a)]
    static_kw = {k: v for k, v in kwargs.items() if not _is_array(v)}
    if not all(_hashable(v) for _, v in static) or not all(
      _hashable(v) for v in static_kw.values()
    ):
      return fn(*args, **kwargs)  # e.g. a callable closure: run as is
    array_args = [a for a in args if _is_array(a)]
    array_names = tuple(k for k in kwargs if k not in static_kw)
    program = _compiled(
      fn, tuple(static), tuple(sorted(static_kw.items())), array_names
    )
    return program(*array_args, *(kwargs[k] for k in array_names))

  return call


def jitted_module(module, names=None):
  """A namespace with the public functions of ``module`` `jitted` (only
  ``names`` when given: functions that return arrays, not factories);
  other attributes as they are."""
  namespace = types.SimpleNamespace()
  for name in dir(module):
    value = getattr(module, name)
    wanted = names is None or name in names
    if (
      wanted
      and not name.startswith('__')
      and isinstance(value, types.FunctionType)
    ):
      value = jitted(value)
    setattr(namespace, name, value)
  return namespace
