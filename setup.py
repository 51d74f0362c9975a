"""fedjax_metric: a JAX federated-learning simulator for metric learning."""

import setuptools

setuptools.setup(
  name='fedjax_metric',
  version='0.1.0',
  description=(
    'Federated learning simulator for metric-learning and '
    'contrastive methods: whole rounds as one XLA program.'
  ),
  # The repository's configs/ and launch/ (a checkout's layout, as in
  # big_vision and the flax examples) also ship inside the package, so that
  # configs load by name and the commands run without a checkout.
  packages=setuptools.find_packages(
    include=['fedjax_metric', 'fedjax_metric.*']
  )
  + ['fedjax_metric.configs', 'fedjax_metric.launch'],
  package_dir={
    'fedjax_metric.configs': 'configs',
    'fedjax_metric.launch': 'launch',
  },
  entry_points={
    'console_scripts': ['fedjax-metric = fedjax_metric.launch.main:run_main'],
  },
  python_requires='>=3.10',
  install_requires=[
    'jax>=0.7',
    'jaxlib>=0.7',
    'flax>=0.10',
    'optax>=0.2.4',
    'numpy>=1.26',
    'absl-py',
    'ml-collections',
    'orbax-checkpoint',
    'scikit-learn',
    'matplotlib',
    'tqdm',
    # TensorBoard event files without TensorFlow (pure Python, protobuf).
    'tensorboardX',
  ],
  extras_require={
    # pytest-xdist: the suite runs in one process per core (make test);
    # ruff: make lint (pinned: its formatter's output changes by version).
    'test': [
      'pytest',
      'pytest-xdist',
      'chex',
      'nbformat',
      'nbclient',
      'ipykernel',
      'ruff==0.17.6',
      # tests/test_package.py builds a wheel without build isolation (no
      # download); setuptools >= 70.1 builds wheels without `wheel`.
      'setuptools>=70.1',
      # The TFDS path is tested for real (tests/tiny_tfds.py prepares a
      # dataset); ArrayRecord datasets need no TensorFlow.
      'tensorflow-datasets',
    ],
    # tensorflow-cpu: only for datasets prepared in TFDS's default TFRecord
    # format; `--file_format=array_record` ones load with TFDS alone.
    'tfds': ['tensorflow-datasets', 'tensorflow-cpu'],
    # The PyTorch per-client loop that benchmarks/bench.py compares against.
    # 2.13.0 is the CPU build this project's machines carry on disk.
    'bench': ['torch==2.13.0'],
  },
)
