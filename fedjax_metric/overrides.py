"""The one parser of ``key=value`` text into config fields.

Every place that turns text into config values goes through here:

* launch.sweep's --set, --grid and --where (``'a.b=1,2;seed=0'``,
  `parse_assignments`), set on a point's config by `apply_overrides`;
* launch.evaluate's --set (``['a.b=value', ...]``, `apply_overrides` through
  `config_io.load_config`);
* a config file's ``:arg`` string (``'runlocal,alpha=0.3'``, `parse_arg`,
  which every config in configs/ calls as ``settings.parse_arg``);
* launch.main's message for a ``--config.a.b=...`` that misses the config
  (`find_field`; ml_collections parses those flags).

A value takes the type of the value it replaces (`parse_value`); a key the
config does not have is a `FieldError` naming the closest field of its block.
Pure Python, no JAX: launch.sweep's table and plot commands use it.
"""

import ast
import difflib
from typing import Any, Dict, Iterable, List, Mapping, Tuple, Union

import ml_collections

# Bool values, as text (compared lowercased).
TRUE = ('true', '1', 'yes')
FALSE = ('false', '0', 'no')


def split_top_level(text: str, sep: str) -> List[str]:
  """Splits ``text`` at ``sep`` outside brackets.

  ``'(8,16),4'`` -> ``['(8,16)', '4']``.
  """
  parts, depth, current = [], 0, []
  for char in text:
    if char in '([{':
      depth += 1
    elif char in ')]}':
      depth -= 1
    if char == sep and depth == 0:
      parts.append(''.join(current))
      current = []
    else:
      current.append(char)
  parts.append(''.join(current))
  return parts


def parse_assignments(text: str) -> List[tuple]:
  """``'a.b=1,2;seed=0'`` -> ``[('a.b', ['1', '2']), ('seed', ['0'])]``."""
  out = []
  for item in filter(
    None, (s.strip() for s in split_top_level(text or '', ';'))
  ):
    key, eq, values = item.partition('=')
    key = key.strip()
    if not eq or not key or not values.strip():
      raise ValueError(
        f'Bad grid item {item!r}: write key=v1,v2 (items separated by ";").'
      )
    if key in [k for k, _ in out]:
      raise ValueError(f'Key {key!r} appears twice in {text!r}.')
    out.append((key, [v.strip() for v in split_top_level(values, ',')]))
  return out


def parse_value(text: str, current: Any) -> Any:
  """``text`` as the type of the field's current value.

  A bool is true/false, 1/0 or yes/no (any case); a string field takes the
  text as it is, or the string a quoted Python literal holds (``'x'``);
  anything that is not a bool, number or string (a tuple, None) is a Python
  literal.

  Raises:
    ValueError: the text is not a value of that type (one line).
  """
  if isinstance(current, bool):
    if text.strip().lower() not in TRUE + FALSE:
      raise ValueError(f'{text!r} is not a bool (true/false).')
    return text.strip().lower() in TRUE
  if isinstance(current, int):
    try:
      return int(text)
    except ValueError:
      raise ValueError(f'not an integer (the field is {current!r})') from None
  if isinstance(current, float):
    try:
      return float(text)
    except ValueError:
      raise ValueError(f'not a number (the field is {current!r})') from None
  if isinstance(current, str):
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      return text
    return value if isinstance(value, str) else text
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    raise ValueError(
      f'not a Python literal (the field is {current!r}; quote a string, '
      "bracket a tuple: '(8,16)')"
    ) from None


_NOT_A_VALUE = object()


class FieldError(KeyError, ValueError):
  """A dotted key that is not a field of the config (one line).

  Attributes:
    key: the dotted key asked for (``'local.learning_rat'``).
    block: the dotted block where the search stopped ('' for the config).
    name: the part of the key that ``block`` lacks.
    close: the field of ``block`` closest to ``name``, or None.
    value: when ``block`` is a value, not a block of fields: that value.
    is_value: whether ``block`` is a value.
  """

  def __init__(self, key, block, name, *, close=None, value=_NOT_A_VALUE):
    self.key, self.block, self.name, self.close = key, block, name, close
    self.is_value = value is not _NOT_A_VALUE
    self.value = None if value is _NOT_A_VALUE else value
    super().__init__(self.describe('Config'))

  def describe(self, subject: str) -> str:
    """The message, with ``subject`` ('Config', 'the config') as its
    subject: the closest field named by its dotted path."""
    if self.is_value:
      return (
        f'{subject} field {self.block!r} is a value ({self.value!r}), not a '
        f'block of fields: {self.key!r} does not exist.'
      )
    prefix = self.block + '.' if self.block else ''
    hint = f'; did you mean {prefix + self.close!r}?' if self.close else '.'
    return f'{subject} has no field {self.key!r}{hint}'

  def __str__(self):
    return str(self.args[0])  # Not KeyError's quoted repr.

  def __reduce__(self):  # Pickles (submitit, multiprocessing) keep it.
    return _field_error, (
      self.args[0],
      self.key,
      self.block,
      self.name,
      self.close,
      self.value if self.is_value else _NOT_A_VALUE,
    )


def _field_error(message, key, block, name, close, value):
  error = FieldError(key, block, name, close=close, value=value)
  error.args = (message,)
  return error


def _is_block(node) -> bool:
  return hasattr(node, 'keys') and not isinstance(node, (str, bytes))


def find_field(config, key: str) -> Tuple[Any, str]:
  """``(block, name)``: where the dotted ``key`` lives in ``config`` (its
  value is ``block[name]``).

  Raises:
    FieldError: a part of the key is missing (with the closest field of its
      block), or lies under a value.
  """
  path = key.split('.')
  node = config
  for depth, name in enumerate(path):
    above = '.'.join(path[:depth])
    if not _is_block(node):
      raise FieldError(key, above, name, value=node)
    if name not in node:
      close = difflib.get_close_matches(name, list(node.keys()), n=1)
      raise FieldError(key, above, name, close=close[0] if close else None)
    if depth < len(path) - 1:
      node = node[name]
  return node, path[-1]


def _one_line(error) -> str:
  return ' '.join(str(error).split())


def apply_overrides(config, overrides: Union[Mapping[str, str], Iterable[str]]):
  """Sets dotted overrides on a config; returns it.

  ``overrides``: ``{'a.b': 'text'}`` (launch.sweep's points), or
  ``'a.b=text'`` items (launch.evaluate's --set, named so in errors). A
  value takes the type of the field it replaces (`parse_value`); a key the
  config does not have is an error (configs are locked), as for
  ``--config.key=value``, naming the closest field of its block.

  Raises:
    FieldError: a key the config does not have.
    ValueError: a value that does not fit its field, an item without '='.
  """
  if isinstance(overrides, Mapping):
    items = [(key, text, None) for key, text in overrides.items()]
  else:
    items = []
    for item in overrides:
      key, sep, text = item.partition('=')
      if not sep:
        raise ValueError(f'--set={item!r} is not key.path=value.')
      items.append((key.strip(), text, f'--set={item!r}'))
  for key, text, given in items:
    try:
      node, name = find_field(config, key)
    except FieldError as e:
      if given is None:
        raise
      e.args = (f'{given}: {e.describe("the config")}',)
      raise e from None
    try:
      node[name] = parse_value(text, node[name])
    except (ValueError, TypeError) as e:
      where = given or f'{key}={text!r}'
      raise ValueError(f'{where}: {_one_line(e)}') from None
  return config


def parse_arg(arg, **defaults) -> ml_collections.ConfigDict:
  """Parses a config's ``:arg`` string, ``'runlocal,dataset=fashion_mnist'``,
  into a ConfigDict of ``defaults``' fields.

  A bare name (or ``name=``) is True; ``key=value`` takes the type of the
  default (`parse_value`). Unknown names are an error.
  """
  parsed = ml_collections.ConfigDict(defaults)
  for item in filter(
    None, (s.strip() for s in split_top_level(arg or '', ','))
  ):
    key, _, value = item.partition('=')
    key, value = key.strip(), value.strip()
    if key not in defaults:
      raise ValueError(
        f'Unknown config argument {key!r}; known: {sorted(defaults)}.'
      )
    if not value:
      parsed[key] = True
      continue
    try:
      parsed[key] = parse_value(value, defaults[key])
    except ValueError as e:
      raise ValueError(f'Config argument {key}={value!r}: {e}') from None
  return parsed


def peek_arg(arg, key, default=''):
  """The value of one ``key=value`` item of an arg string, before parsing."""
  for item in split_top_level(arg or '', ','):
    name, _, value = item.partition('=')
    if name.strip() == key:
      return value.strip()
  return default


def assignments(text: str) -> Dict[str, str]:
  """``'a=1;b=(2,3)'`` -> ``{'a': '1', 'b': '(2,3)'}``: `parse_assignments`
  with each key's first value (--where, a paper table's overrides)."""
  return {key: values[0] for key, values in parse_assignments(text)}
