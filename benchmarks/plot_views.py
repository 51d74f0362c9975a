r"""Draws SimCLR two-view augmentations (SSD / FedU2) for a visual check.

  python -m benchmarks.plot_views                       # docs/results/ssl_views.png
  python -m benchmarks.plot_views --order=fedu2 --output=/tmp/fedu2_views.png

Two panels, each a grid of ``--num_images`` rows x [original, view 1,
view 2], made by `views.make_two_view_augment` (the crop, flip, colour
jitter and grayscale of Fang et al., 'Soft Separation and Distillation:
Toward Global Uniformity in Federated Unsupervised Learning', ICCV 2025):

  * grayscale: Fashion-MNIST test images (28x28) when their files are in
    ``--fashion_mnist_dir``, else scikit-learn's 8x8 digits upsampled
    bilinearly to 32x32; only crop, flip, brightness and contrast act on
    them.
  * colour: a synthetic set of 32x32 RGB images (a disc, square or stripes in
    one hue on a background gradient in another), so that the colour jitter
    and grayscale are visible without any dataset on disk.

Nothing is downloaded.
"""

import colorsys
import os

from absl import app, flags
import jax
import jax.numpy as jnp
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
import numpy as np

from fedjax_metric.data import sources, views

FLAGS = flags.FLAGS
flags.DEFINE_string('output', 'docs/results/ssl_views.png', 'PNG to write.')
flags.DEFINE_integer('num_images', 8, 'Rows per panel.')
flags.DEFINE_integer('seed', 0, 'Seed of the images chosen and the views.')
flags.DEFINE_enum(
  'order',
  'ssd',
  list(views.VIEW_ORDERS),
  'Augmentation order (and default crop scale).',
)
flags.DEFINE_string(
  'fashion_mnist_dir',
  sources.DEFAULT_DIRS['fashion_mnist'],
  'Fashion-MNIST IDX files; digits are used when absent.',
)


def grayscale_images(num: int, seed: int, fashion_mnist_dir: str):
  """(uint8 [num, H, W, 1], name): Fashion-MNIST or upsampled digits."""
  rng = np.random.RandomState(seed)
  try:
    ds = sources.load('fashion_mnist', 'test', fashion_mnist_dir)
    name = 'Fashion-MNIST (28x28)'
    images = ds.images
  except (sources.DatasetNotFoundError, FileNotFoundError, OSError):
    ds = sources.load('digits', 'test')
    name = 'digits (8x8 -> 32x32 bilinear)'
    upsample = jax.vmap(lambda x: views.resized_crop(x, 0, 0, 8, 8, (32, 32)))
    images = np.round(np.asarray(upsample(jnp.asarray(ds.images))) * 255.0)
    images = images.astype(np.uint8)
  # One image per class first, so the rows differ.
  picks = [
    rng.choice(np.flatnonzero(ds.labels == c)) for c in range(ds.num_classes)
  ]
  return images[np.array(picks[:num])], name


def synthetic_colour_images(num: int, seed: int, size: int = 32):
  """uint8 [num, size, size, 3]: a shape in one hue on a gradient in another."""
  rng = np.random.RandomState(seed)
  yy, xx = np.mgrid[0:size, 0:size] / (size - 1.0)
  images = []
  for i in range(num):
    hue = rng.uniform()
    background = np.array(colorsys.hsv_to_rgb(hue, 0.5, 0.9))
    foreground = np.array(
      colorsys.hsv_to_rgb((hue + rng.uniform(0.3, 0.7)) % 1.0, 0.9, 0.8)
    )
    angle = rng.uniform(0, 2 * np.pi)
    ramp = 0.6 + 0.4 * (np.cos(angle) * xx + np.sin(angle) * yy + 1) / 2
    image = ramp[..., None] * background
    cy, cx = rng.uniform(0.3, 0.7, 2)
    radius = rng.uniform(0.15, 0.3)
    kind = i % 3
    if kind == 0:
      inside = (yy - cy) ** 2 + (xx - cx) ** 2 < radius**2
    elif kind == 1:
      inside = (abs(yy - cy) < radius) & (abs(xx - cx) < radius)
    else:
      inside = (np.sin((xx + yy) * 6 * np.pi) > 0.3) & (
        (yy - cy) ** 2 + (xx - cx) ** 2 < (1.5 * radius) ** 2
      )
    image[inside] = foreground
    images.append(np.round(np.clip(image, 0, 1) * 255))
  return np.stack(images).astype(np.uint8)


def draw_panel(fig, grid_spec, images, view1, view2, title):
  """One panel: rows of [original, view 1, view 2]."""
  columns = ('original', 'view 1', 'view 2')
  for row in range(len(images)):
    for col, batch in enumerate((images / 255.0, view1, view2)):
      ax = fig.add_subplot(grid_spec[row, col])
      picture = np.asarray(batch[row])
      if picture.shape[-1] == 1:
        ax.imshow(picture[..., 0], cmap='gray', vmin=0, vmax=1)
      else:
        ax.imshow(np.clip(picture, 0, 1))
      ax.set_xticks([])
      ax.set_yticks([])
      if row == 0:
        ax.set_title(
          f'{title}\n{columns[col]}' if col == 1 else columns[col], fontsize=9
        )


def main(argv):
  del argv
  num = FLAGS.num_images
  gray, gray_name = grayscale_images(num, FLAGS.seed, FLAGS.fashion_mnist_dir)
  colour = synthetic_colour_images(num, FLAGS.seed)
  two_views = jax.jit(views.make_two_view_augment(order=FLAGS.order))
  gray_key, colour_key = jax.random.split(jax.random.key(FLAGS.seed))
  gray_views = two_views(jnp.asarray(gray), gray_key)
  colour_views = two_views(jnp.asarray(colour), colour_key)

  fig = Figure(figsize=(7.2, 1.2 * num + 0.9))
  FigureCanvasAgg(fig)
  outer = fig.add_gridspec(
    1,
    2,
    wspace=0.12,
    left=0.02,
    right=0.98,
    top=1 - 0.75 / (1.2 * num + 0.9),
    bottom=0.01,
  )
  draw_panel(
    fig,
    outer[0].subgridspec(num, 3, wspace=0.05, hspace=0.08),
    gray,
    *gray_views,
    gray_name,
  )
  draw_panel(
    fig,
    outer[1].subgridspec(num, 3, wspace=0.05, hspace=0.08),
    colour,
    *colour_views,
    'synthetic colour (32x32)',
  )
  fig.suptitle(
    f"Two-view augmentation, order '{FLAGS.order}' (crop, flip, "
    'colour jitter, grayscale)',
    fontsize=10,
  )
  os.makedirs(os.path.dirname(FLAGS.output) or '.', exist_ok=True)
  fig.savefig(FLAGS.output, dpi=110)
  print(f'Wrote {FLAGS.output} ({gray_name}; synthetic colour).')


if __name__ == '__main__':
  app.run(main)
