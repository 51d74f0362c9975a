"""algorithms/spec.py: declared options, checked once; hooks that are not
closures; the config refusing a server optimizer an algorithm ignores."""

import dataclasses
import functools
import typing

import fl_fixtures as fx
import pytest

from fedjax_metric import algorithms, config_io, engine, optimizers, validation
from fedjax_metric.algorithms import fedavg, spec

SERVER = optimizers.make_server_optimizer('sgd')
SPECS = sorted(algorithms.REGISTRY)


def test_every_registered_algorithm_is_a_spec_with_a_description():
  for name, entry in algorithms.REGISTRY.items():
    assert isinstance(entry, spec.AlgorithmSpec), name
    assert entry.name == name
    assert dataclasses.is_dataclass(entry.options), name
    assert entry.description, name
  assert set(algorithms()) == set(algorithms.REGISTRY)


@pytest.mark.parametrize('name', SPECS)
def test_an_unknown_option_is_refused_naming_the_known_ones(name):
  entry = algorithms.REGISTRY[name]
  with pytest.raises(ValueError) as error:
    entry.make_options(not_an_option=1)
  message = str(error.value)
  assert '\n' not in message
  assert 'not_an_option' in message
  for known in entry.option_names():
    assert known in message


@pytest.mark.parametrize('name', SPECS)
def test_a_mistyped_option_is_refused_naming_the_field(name):
  """Every number field refuses a string, every text field a number, every
  flag a number: one line naming the field."""
  entry = algorithms.REGISTRY[name]
  hints = typing.get_type_hints(entry.options)
  wrong = {float: 'x', int: 'x', bool: 3, str: 3}
  for field in entry.option_names():
    bad = wrong.get(hints[field])
    if bad is None:
      continue
    with pytest.raises(ValueError, match=field) as error:
      entry.make_options(**{field: bad})
    assert '\n' not in str(error.value)
  if not entry.option_names():
    assert entry.options is spec.NoOptions


def test_ints_pass_for_floats_but_bools_do_not():
  fedprox = algorithms.REGISTRY['fedprox']
  assert fedprox.make_options(mu=1).mu == 1
  with pytest.raises(ValueError, match='mu'):
    fedprox.make_options(mu=True)
  with pytest.raises(ValueError, match='>= 0'):
    fedprox.make_options(mu=-1.0)  # The dataclass's own range check.


def test_fixed_options_cannot_be_set():
  @dataclasses.dataclass(frozen=True)
  class Options:
    variant: typing.Literal['a', 'b'] = 'a'
    weight: float = 1.0

  entry = spec.AlgorithmSpec(
    'variant_b',
    lambda model, options, **_: options,
    Options,
    fixed={'variant': 'b'},
  )
  assert entry.option_names() == ['weight']
  assert entry.make_options().variant == 'b'
  with pytest.raises(ValueError, match='variant'):
    entry.make_options(variant='a')
  loose = spec.AlgorithmSpec('loose', lambda m, o, **_: o, Options)
  with pytest.raises(ValueError, match=r"one of \['a', 'b'\]"):
    loose.make_options(variant='c')


def test_only_declared_inputs_reach_build():
  seen = {}

  def build(model, options, **reads):
    seen.update(reads)
    return options

  reads_nothing = spec.AlgorithmSpec('quiet', build, reads=())
  reads_nothing(None, server_optimizer=SERVER, weighting='uniform')
  assert seen == {}
  reads_run = spec.AlgorithmSpec('facts', build, reads=('run', 'weighting'))
  reads_run(None, weighting='uniform')
  assert set(seen) == {'run', 'weighting'}
  with pytest.raises(ValueError, match='server_optimizer'):
    spec.AlgorithmSpec('needs_server', build)(None)
  with pytest.raises(ValueError, match='reads'):
    spec.AlgorithmSpec('typo', build, reads=('server',))


def _module_level(fn) -> bool:
  """A module-level function, or a functools.partial of one."""
  while isinstance(fn, functools.partial):
    fn = fn.func
  return '<locals>' not in getattr(fn, '__qualname__', '<locals>')


@pytest.mark.parametrize('name', SPECS)
def test_no_hook_is_a_closure(name):
  """Every hook of every built algorithm is a module-level function (bound
  with functools.partial): readable and testable on its own."""
  images, labels, parts, data = fx.dirichlet_federation()
  algorithm = algorithms.REGISTRY[name](
    fx.all_outputs(),
    server_optimizer=SERVER,
    run=fx.partition_facts(parts, labels),
  )
  assert isinstance(algorithm, engine.Algorithm)
  closures = [
    slot
    for slot, hook in algorithm._asdict().items()
    if hook is not None and not _module_level(hook)
  ]
  assert not closures, (name, closures)


def test_the_closure_check_can_fail():
  def closure(x):
    return x

  assert not _module_level(closure)
  assert _module_level(functools.partial(fedavg.delta_final, 'uniform'))


def _config_with_server(algorithm, **server):
  config = config_io.load_config(f'configs/{algorithm}.py:runlocal')
  for key, value in server.items():
    config.server[key] = value
  return config


def test_a_server_optimizer_is_refused_where_nothing_reads_it(monkeypatch):
  """A spec that does not read the server optimizer: the config check
  refuses a non-default server block with one line, before anything runs;
  the defaults pass."""
  fedavg_spec = algorithms.REGISTRY['fedavg']
  quiet = dataclasses.replace(fedavg_spec, reads=frozenset({'weighting'}))
  monkeypatch.setitem(algorithms.REGISTRY, 'fedavg', quiet)
  validation._check_algorithm(_config_with_server('fedavg'))
  for field, value in (('optimizer', 'adam'), ('momentum', 0.9)):
    config = _config_with_server('fedavg', **{field: value})
    with pytest.raises(validation.ConfigError, match=field) as error:
      validation._check_algorithm(config)
    assert '\n' not in str(error.value)
  monkeypatch.setitem(algorithms.REGISTRY, 'fedavg', fedavg_spec)
  validation._check_algorithm(_config_with_server('fedavg', optimizer='adam'))


def test_config_options_are_checked_before_anything_runs():
  config = config_io.load_config('configs/fedprox.py:runlocal')
  config.algorithm_kwargs.mu = -1.0
  with pytest.raises(validation.ConfigError, match='mu'):
    validation._check_algorithm(config)
