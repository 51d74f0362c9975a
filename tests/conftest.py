"""Settings for every test, applied before JAX starts.

* Four simulated CPU devices, so the sharded paths are tested on any machine
  (on a GPU machine the mesh tests build their meshes from these CPU devices).
* Matmul precision 'highest': tests compare with float64 NumPy references at
  ~1e-5; on GPUs the default (TF32) changes results at ~1e-3. On CPU it
  changes nothing. The library's own precision is a config choice
  (`config.precision`), documented in the README.
* Most XLA optimisations off: the suite compiles hundreds of tiny programs,
  and compiling dominates its run time; the numerics compared are unaffected
  (the tests' tolerances hold either way, checked on CPU).

Tests that compare a subprocess with an in-process run bit for bit give the
subprocess the same settings through `JAX_ENV`.
"""

import jax

JAX_ENV = {
  'JAX_NUM_CPU_DEVICES': '4',
  'JAX_DEFAULT_MATMUL_PRECISION': 'highest',
  'JAX_DISABLE_MOST_OPTIMIZATIONS': 'true',
}

jax.config.update('jax_num_cpu_devices', 4)
jax.config.update('jax_default_matmul_precision', 'highest')
jax.config.update('jax_disable_most_optimizations', True)
