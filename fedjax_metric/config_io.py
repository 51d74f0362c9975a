"""Configs in: the one loader of a run's config, and its flat form.

`load_config` builds a config from one of two places, then applies overrides
(`overrides.apply_overrides`):

* a config file, ``'configs/fedavg.py:runlocal'``, or a packaged config by
  name, ``'fedavg:runlocal'`` (the file's ``get_config(arg)``): what
  ``fm.get_config`` and each launch.sweep point train;
* a run's workdir, ``load_config(workdir=...)``: its ``config.json`` written
  into the full schema of fedjax_metric/settings.py (fields added to the
  library since keep their defaults, so older workdirs load too), as
  ``fm.load_run``, launch.evaluate and launch.report read it.

`flatten` is the dotted-path view (``{'local.learning_rate': 0.05}``) in
which the resume checks, the validation rules, the TensorBoard hparams and
the sweep's tables see a config. No JAX: launch.sweep's tables import this.
"""

import importlib.util
import json
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

import ml_collections

from fedjax_metric import overrides as overrides_lib
from fedjax_metric import settings

# Blocks a method config replaces as a whole (fedjax_metric/settings.py).
WHOLE_BLOCKS = ('model', 'algorithm_kwargs')


class ConfigError(ValueError):
  """A config value that cannot work; the message names the field and fix.
  (Defined here, below every module that raises it; validation.py, which
  raises most of them, re-exports it.)"""


def configs_dir() -> str:
  """The directory of the packaged config files: ``fedjax_metric/configs``
  in an installed package, the repository's ``configs/`` in a checkout."""
  spec = importlib.util.find_spec('fedjax_metric.configs')
  if spec is not None and spec.submodule_search_locations:
    return list(spec.submodule_search_locations)[0]
  checkout = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'configs')
  if os.path.isdir(checkout):
    return checkout
  raise FileNotFoundError(
    'The packaged configs are missing: reinstall fedjax_metric, or pass a '
    'config file path.'
  )


def config_names() -> List[str]:
  """The packaged configs' names (``fedavg``, ``fedquad``, ...)."""
  return sorted(
    name[:-3]
    for name in os.listdir(configs_dir())
    if name.endswith('.py') and not name.startswith('_')
  )


def config_file(name_or_path: str) -> str:
  """The file of a packaged config name, or ``name_or_path`` itself when it
  is a path (it contains a separator or ends in ``.py``)."""
  if os.sep in name_or_path or name_or_path.endswith('.py'):
    return name_or_path
  if name_or_path not in config_names():
    raise ValueError(
      f'No packaged config {name_or_path!r}; the packaged ones are '
      f'{", ".join(config_names())}. A file of your own: pass its path '
      '(my_config.py).'
    )
  return os.path.join(configs_dir(), name_or_path + '.py')


def check_python_file(path: str) -> None:
  """Refuses an existing ``path`` that is not a .py file (a directory, a
  README) in one line, before anything tries to import it."""
  if os.path.exists(path) and (
    not os.path.isfile(path) or not path.endswith('.py')
  ):
    raise ValueError(
      f'--config {path!r} is not a Python file; a config is a .py file with '
      'get_config() (configs/fedavg.py) or a packaged name (fedavg).'
    )


def _from_file(spec: str) -> ml_collections.ConfigDict:
  """``'name_or_path[:arg]'`` -> the config file's ``get_config(arg)``."""
  name, _, arg = spec.partition(':')
  path = config_file(name)
  if not os.path.exists(path):
    raise FileNotFoundError(
      f'Config file {path!r} not found (run from the repository root, or '
      'name a packaged config: fedavg, fedquad, ...).'
    )
  check_python_file(path)
  module_name = '_fedjax_metric_config_' + os.path.basename(path)[:-3]
  module_spec = importlib.util.spec_from_file_location(module_name, path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def read_config_json(workdir: str) -> Dict[str, Any]:
  """A workdir's ``config.json`` as written (nested dicts)."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    raise FileNotFoundError(
      f"{path} not found: is {workdir} a run's "
      'workdir (python -m launch.main --workdir=...)?'
    )
  with open(path) as f:
    return json.load(f)


def _merge(target, saved, top=True):
  """Writes the saved values into a fresh base config (new fields keep their
  defaults, so older workdirs load too)."""
  for key, value in saved.items():
    if top and key in WHOLE_BLOCKS:
      target[key] = ml_collections.ConfigDict(value)
    elif (
      isinstance(value, dict)
      and key in target
      and isinstance(target[key], ml_collections.ConfigDict)
    ):
      _merge(target[key], value, top=False)
    else:
      target[key] = value


def _from_workdir(workdir: str) -> ml_collections.ConfigDict:
  config = settings.base_config()
  _merge(config, read_config_json(workdir))
  return config


def load_config(
  spec: Optional[str] = None,
  overrides: Union[Mapping[str, str], Iterable[str]] = (),
  *,
  workdir: Optional[str] = None,
) -> ml_collections.ConfigDict:
  """The config of ``spec`` or of ``workdir`` (one of them), with
  ``overrides`` applied.

  Args:
    spec: ``'configs/x.py[:arg]'`` or a packaged config's ``'name[:arg]'``.
    overrides: ``{'a.b': 'text'}`` or ``['a.b=text', ...]``
      (`overrides.apply_overrides`: each value takes its field's type).
    workdir: a run's directory: its ``config.json`` in the full schema.

  Raises:
    FileNotFoundError: the config file, or the workdir's config.json, is
      missing.
    ValueError / overrides.FieldError: a packaged name or an override that
      does not fit.
  """
  if (spec is None) == (workdir is None):
    raise TypeError(
      'load_config takes a config spec or a workdir: one of them.'
    )
  config = _from_file(spec) if workdir is None else _from_workdir(workdir)
  if overrides:
    overrides_lib.apply_overrides(config, overrides)
  return config


def flatten(
  tree: Mapping[str, Any], prefix: str = '', *, hashable: bool = False
) -> Dict[str, Any]:
  """Nested dict -> ``{'a.b': leaf}``, in key order at every level.

  ``hashable``: lists become tuples (the sweep's table cells are keyed and
  labelled by these values).
  """
  out = {}
  for key in sorted(tree):
    value = tree[key]
    name = f'{prefix}{key}'
    if isinstance(value, dict):
      out.update(flatten(value, name + '.', hashable=hashable))
    elif hashable and isinstance(value, list):
      out[name] = tuple(value)
    else:
      out[name] = value
  return out
