"""Where FedMetric's one-step round spends its time on a CPU (hand-run).

One client step of the one-class LeNet (GroupNorm, 32-d embedding, batch 16)
and a cohort of 10 such steps in the forms a round can take, each jitted and
timed as the best of 5 repeats. Results are recorded by hand in
benchmarks/cpu_notes.md ("FedMetric's LeNet round").

  python benchmarks/lenet_client_step.py
  taskset -c 0 python benchmarks/lenet_client_step.py   # one core
"""

import time

import jax
import jax.numpy as jnp

from fedjax_metric.models.lenet import LeNet

CLIENTS, BATCH = 10, 16


def best_ms(fn, *args, calls=40):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(5):
    start = time.perf_counter()
    for _ in range(calls // 5):
      out = fn(*args)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / (calls // 5))
  return 1e3 * min(times)


def main():
  images = jax.random.normal(jax.random.key(0), (CLIENTS, BATCH, 28, 28, 1))
  for impl in ('xla', 'patches'):
    model = LeNet(conv_impl=impl)
    variables = model.init(jax.random.key(1), images[0], train=True)

    def embed(v, x):
      return model.apply(v, x, train=True)['embedding']

    def loss(v, x):
      return jnp.sum(jnp.square(embed(v, x)))

    grad = jax.grad(loss)
    merged = images.reshape((CLIENTS * BATCH,) + images.shape[2:])
    rows = {
      'forward, 16 examples': (jax.jit(embed), variables, images[0]),
      'forward, 160 examples': (jax.jit(embed), variables, merged),
      'step (grad), 16 examples': (jax.jit(grad), variables, images[0]),
      'step (grad), 160 examples': (jax.jit(grad), variables, merged),
      '10 clients: lax.map of steps': (
        jax.jit(lambda v, x: jax.lax.map(lambda xi: grad(v, xi), x)),
        variables,
        images,
      ),
      '10 clients: unrolled steps': (
        jax.jit(lambda v, x: [grad(v, x[i]) for i in range(CLIENTS)]),
        variables,
        images,
      ),
      '10 clients: vmap, shared weights': (
        jax.jit(jax.vmap(grad, in_axes=(None, 0))),
        variables,
        images,
      ),
      '10 clients: vmap, per-client weights': (
        jax.jit(jax.vmap(grad)),
        jax.tree.map(
          lambda a: jnp.broadcast_to(a, (CLIENTS,) + a.shape), variables
        ),
        images,
      ),
    }
    for name, (fn, *args) in rows.items():
      print(f'| {impl} | {name} | {best_ms(fn, *args):.2f} |', flush=True)


if __name__ == '__main__':
  main()
