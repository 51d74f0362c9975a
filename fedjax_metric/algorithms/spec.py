"""How the registry builds an algorithm: its typed options and what it reads.

An algorithm module declares

* ``Options``: a frozen dataclass, one field per hyperparameter with its
  default, documented in the class docstring with the paper's symbol, and
  range checks in ``__post_init__``;
* module-level pure hook functions whose first arguments are the options
  (and the model); ``build`` binds them with `functools.partial`, so no hook
  is a closure over a factory's locals;
* ``build(model, options, **reads) -> engine.Algorithm``;
* ``SPECS``: one `AlgorithmSpec` per registered name (FedQuad's module
  registers four variants of one loss).

`AlgorithmSpec` checks the options once, where they enter: an unknown
name, a value of the wrong type, or a value out of range is refused with
one line naming the field and what it takes. ``reads`` declares which of
the run's other inputs ``build`` takes: ``server_optimizer`` (the optax
transformation of the pseudo-gradient), ``weighting`` (config.server.
weighting) and ``run`` (`contract.RunFacts`). The config checks use it to
refuse a server setting an algorithm would ignore (validation.py).
"""

import dataclasses
import typing
from typing import Any, Callable, FrozenSet, Mapping, Optional

from fedjax_metric.contract import NO_RUN_FACTS, RunFacts

# The run inputs an algorithm may read besides its options.
READABLE = frozenset({'server_optimizer', 'weighting', 'run'})


@dataclasses.dataclass(frozen=True)
class NoOptions:
  """An algorithm without hyperparameters of its own."""


NO_OPTIONS = NoOptions()


def _type_problem(value, annotation) -> Optional[str]:
  """None if ``value`` fits the field type ``annotation``, else what it
  takes, in words. Ints are accepted for floats (``mu=1``); bools are not
  numbers here (``mu=True`` is a mistake)."""
  origin = typing.get_origin(annotation)
  if annotation is Any:
    return None
  if origin is typing.Union:
    problems = [_type_problem(value, a) for a in typing.get_args(annotation)]
    if any(p is None for p in problems):
      return None
    return ' or '.join(problems)
  if origin is typing.Literal:
    choices = typing.get_args(annotation)
    return None if value in choices else f'one of {list(choices)}'
  if annotation is type(None):
    return None if value is None else 'None'
  if annotation is float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return None if ok else 'a number'
  if annotation is int:
    ok = isinstance(value, int) and not isinstance(value, bool)
    return None if ok else 'an integer'
  if annotation is bool:
    return None if isinstance(value, bool) else 'True or False'
  if annotation is str:
    return None if isinstance(value, str) else 'a string'
  if origin in (tuple, list) or annotation in (tuple, list):
    return None if isinstance(value, (tuple, list)) else 'a tuple (a, b, ...)'
  return None  # Anything else (a callable, a mapping) is the hook's to check.


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """One registered algorithm.

  Attributes:
    name: the registry's name (``config.algorithm``).
    build: ``(model, options, **reads) -> engine.Algorithm``.
    options: the ``Options`` dataclass (`NoOptions` when there are none).
    reads: which of `READABLE` ``build`` takes as keywords.
    description: one line, the paper and what the method changes.
    fixed: option values this name sets and a config cannot change
      (QuadrupletFL is FedQuad's module with ``variant='quadruplet'``).
  """

  name: str
  build: Callable[..., Any]
  options: type = NoOptions
  reads: FrozenSet[str] = frozenset({'server_optimizer', 'weighting'})
  description: str = ''
  fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    unknown = set(self.reads) - READABLE
    if unknown:
      raise ValueError(f'{self.name}: reads {sorted(unknown)}; see READABLE.')
    object.__setattr__(self, 'reads', frozenset(self.reads))

  def option_names(self):
    """The names a config's ``algorithm_kwargs`` may set."""
    return sorted(
      f.name
      for f in dataclasses.fields(self.options)
      if f.name not in self.fixed
    )

  def make_options(self, **values):
    """The checked ``Options``: unknown names, wrong types and (in the
    dataclass's ``__post_init__``) values out of range raise ValueError
    with one line naming the field."""
    known = self.option_names()
    unknown = sorted(set(values) - set(known))
    if unknown:
      raise ValueError(
        f'algorithm {self.name!r} has no option {unknown}; it takes '
        f'{known} (--config.algorithm_kwargs.<name>).'
      )
    hints = typing.get_type_hints(self.options)
    for name, value in values.items():
      problem = _type_problem(value, hints.get(name, Any))
      if problem is not None:
        raise ValueError(
          f'--config.algorithm_kwargs.{name}={value!r}: algorithm '
          f'{self.name!r} takes {problem} there.'
        )
    return self.options(**{**values, **self.fixed})

  def __call__(
    self,
    model,
    *,
    server_optimizer=None,
    run: RunFacts = NO_RUN_FACTS,
    weighting: Optional[str] = None,
    **options,
  ):
    """Builds the `engine.Algorithm`. ``weighting=None`` keeps the
    algorithm's own default; inputs the algorithm does not read are not
    passed on (the config checks refuse a setting that would be ignored)."""
    given = {'server_optimizer': server_optimizer, 'run': run}
    if weighting is not None:
      given['weighting'] = weighting
    reads = {k: v for k, v in given.items() if k in self.reads}
    if 'server_optimizer' in self.reads and server_optimizer is None:
      raise ValueError(f'algorithm {self.name!r} needs a server_optimizer.')
    return self.build(model, self.make_options(**options), **reads)
