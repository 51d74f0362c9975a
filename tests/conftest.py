"""Four simulated CPU devices for every test (set before JAX starts)."""

import jax

jax.config.update('jax_num_cpu_devices', 4)
