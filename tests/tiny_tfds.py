"""A tiny image-classification TFDS dataset, prepared like a real one.

`python tests/tiny_tfds.py DATA_DIR [FORMAT]` writes `tiny_shapes` (3
classes, 6x5 RGB PNG images, 40 train and 10 test examples) into DATA_DIR with
TFDS's own builder, as `tfds build --file_format=FORMAT` would. The tests run
it in a separate process so that the process that loads the dataset has no
builder class registered: it reads the files alone, like a user who copied a
prepared data directory to a machine without internet. `examples` is the
NumPy truth the tests compare against (no TFDS needed).
"""

import io
import sys

import numpy as np

NAME = 'tiny_shapes'
SHAPE = (6, 5, 3)
NUM_CLASSES = 3
SIZES = {'train': 40, 'test': 10}


def examples(split):
  """([N, 6, 5, 3] uint8 images, [N] labels) of a split, in writing order."""
  rng = np.random.default_rng(list(SIZES).index(split))
  n = SIZES[split]
  images = rng.integers(0, 256, (n, *SHAPE), dtype=np.uint8)
  return images, np.arange(n) % NUM_CLASSES


def _png(image):
  from PIL import Image  # pylint: disable=g-import-not-at-top

  out = io.BytesIO()
  Image.fromarray(image).save(out, format='PNG')
  return out.getvalue()


def prepare(data_dir, file_format='array_record'):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  class TinyShapes(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version('1.0.0')

    def _info(self):
      return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict(
          {
            'image': tfds.features.Image(shape=SHAPE),
            'label': tfds.features.ClassLabel(num_classes=NUM_CLASSES),
          }
        ),
        supervised_keys=('image', 'label'),
      )

    def _split_generators(self, dl_manager):
      del dl_manager  # Nothing to download.
      return {split: self._generate_examples(split) for split in SIZES}

    def _generate_examples(self, split):
      # Encoded bytes: TFDS encodes arrays with TensorFlow, which the
      # suite does not install.
      for i, (image, label) in enumerate(zip(*examples(split))):
        yield i, {'image': io.BytesIO(_png(image)), 'label': int(label)}

  TinyShapes(data_dir=data_dir, file_format=file_format).download_and_prepare()


if __name__ == '__main__':
  prepare(*sys.argv[1:])
