"""The workload flags the benchmark tools share (one definition, one help text).

bench, profile_round and scaling time the same kind of round: a model on
synthetic images, ``local_steps`` steps of ``batch_size`` per client, a
convolution form and a matmul precision. Each tool calls `define` with its
own defaults and adds the flags only it has.
"""

from typing import Dict, Optional, Sequence

from absl import flags

from fedjax_metric import executors


def define(
  *,
  rounds: int,
  rounds_help: str = 'Timed rounds after warm-up.',
  model: str = 'small_cnn',
  models: Optional[Sequence[str]] = None,
  pool: str = 'stride',
  image_shape: Sequence[int] = (28, 28, 1),
  local_steps: int = 10,
  batch_size: int = 32,
  conv_impl: str = 'auto',
  precision: str = 'default',
  unroll: bool = False,
) -> Dict[str, flags.FlagHolder]:
  """Defines --model, --pool, --image_shape, --local_steps, --batch_size,
  --rounds, --conv_impl, --precision (and --unroll if asked); returns their
  holders by name. ``models``: the allowed model names (an enum), or None
  for any name `models.build` knows."""
  held = {}
  if models:
    held['model'] = flags.DEFINE_enum(
      'model',
      model,
      list(models),
      'Model (fedquad_cnn: 64/128/256 channels, BatchNorm).',
    )
  else:
    held['model'] = flags.DEFINE_string(
      'model', model, 'Model (models.build); --pool applies to small_cnn.'
    )
  held['pool'] = flags.DEFINE_string(
    'pool', pool, 'small_cnn pool: stride|avg|max.'
  )
  held['image_shape'] = flags.DEFINE_list(
    'image_shape', [str(x) for x in image_shape], 'H,W,C of the images.'
  )
  held['local_steps'] = flags.DEFINE_integer(
    'local_steps', local_steps, 'Local steps per client.'
  )
  held['batch_size'] = flags.DEFINE_integer(
    'batch_size', batch_size, 'Batch size.'
  )
  held['rounds'] = flags.DEFINE_integer('rounds', rounds, rounds_help)
  held['conv_impl'] = flags.DEFINE_enum(
    'conv_impl',
    conv_impl,
    list(executors.CONV_IMPLS),
    'Convolution form (config.model.conv_impl; auto: patches except in the '
    'host loop, executors.resolve_conv_impl).',
  )
  held['precision'] = flags.DEFINE_enum(
    'precision',
    precision,
    list(executors.PRECISIONS),
    'Matmul precision (config.precision).',
  )
  if unroll:
    held['unroll'] = flags.DEFINE_boolean(
      'unroll',
      None,
      'Unroll local steps in vmap/chunked (default: on CPU with xla '
      'convolutions, whose grouped backward is slow inside a loop there).',
    )
  return held
