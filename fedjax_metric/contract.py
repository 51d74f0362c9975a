"""The contract between an algorithm and the engine: the types they exchange.

An algorithm (`Algorithm`) is a set of pure functions the engine calls at
fixed points of a round; each gets a `ClientContext` (what a client knows
during its local training) or the round's `Aggregate`, and the state lives
in `ServerState` (global) and the client table (one row per client, the
algorithm's own pytree). `RoundSpec` is what the engine needs beyond the
algorithm (optimizer, schedule, preprocessing, seed); the training set on
the device is data/cohort.py's `DeviceData`. How a round uses them: engine.py; how to write
an algorithm against them: docs/adding_an_algorithm.md.
"""

from typing import Any, Callable, NamedTuple, Optional

import jax
import optax


class ServerState(NamedTuple):
  """Global state. ``extra`` is the algorithm's own (e.g. past global models)."""

  variables: Any
  opt_state: Any
  round: jax.Array  # int32 scalar: rounds completed.
  extra: Any = ()


class Batch(NamedTuple):
  images: jax.Array  # float [B, H, W, C], preprocessed (and augmented).
  labels: jax.Array  # int32 [B]
  mask: jax.Array  # bool [B]; False for padded examples.
  raw_images: jax.Array  # uint8 [B, H, W, C]: for losses that draw their own
  # augmented views (SSD); unused inputs cost nothing.


class ClientContext(NamedTuple):
  """Everything a client hook may read besides its params and batch.

  Attributes:
    server_state: the round's `ServerState` (global model, server extra).
    client_row: this client's row of the client table, or ``()``.
    local_state: what ``client_begin`` returned, as updated by
      ``client_step_end``; ``()`` inside ``client_begin`` itself.
    client_id: int32 scalar, the client's index in [0, N).
    slot: int32 scalar, the client's position in this round's cohort.
    key: PRNG key depending on (seed, round, client id, step) only.
    step: int32 scalar, the local step (S in ``client_final``).
    learning_rate: float32 scalar, the round's local learning rate (before a
      per-local-epoch decay).
    num_steps: float32 scalar, the client's real (non-padding) local steps
      this round.
    num_examples: float32 scalar, the client's dataset size n_k.
    scan_batches: ``(fn, init) -> carry``: runs ``fn(carry, batch)`` over
      this round's S batches of the client (a `lax.scan`; padded steps and
      examples are masked, with the training preprocessing and a fixed key).
      In epoch mode the first ceil(n_k / B) batches hold every local example
      once: FedMetric computes its local center and radius this way.
  """

  server_state: ServerState
  client_row: Any
  local_state: Any
  client_id: jax.Array
  slot: jax.Array
  key: jax.Array
  step: jax.Array
  learning_rate: jax.Array
  num_steps: jax.Array
  num_examples: jax.Array
  scan_batches: Callable[..., Any]


class Aggregate(NamedTuple):
  """The cohort's contribution, already reduced over slots.

  ``update_sum = sum_c w_c * update_c`` with ``w_c = 0`` for padding slots.
  """

  update_sum: Any
  weight_sum: jax.Array
  num_participants: jax.Array
  client_ids: jax.Array  # [C]
  slot_mask: jax.Array  # [C]
  # N, the client population (a Python int): what MIFA, FedVarp and
  # SCAFFOLD divide by. 0 where unknown (an Aggregate built by hand).
  num_clients: int = 0


class Algorithm(NamedTuple):
  """A federated algorithm: pure functions, hyperparameters closed over.

  Every client hook takes the `ClientContext`, as its last argument (after
  the values it differentiates or updates). FedAvg fills each slot
  (algorithms/fedavg.py); a method replaces the slots it changes.

  Attributes:
    init_server: ``(variables, num_clients, key) -> ServerState``; owns the
      server optimizer's state and the algorithm's ``extra``.
    init_client: ``(variables, key) -> row`` for ONE client; the engine vmaps
      it over N per-client keys into the client table. ``()`` when stateless.
    client_begin: ``ctx -> (start_variables, local_state)``: the model the
      client trains from (the global one, or a personal one from its row) and
      the per-round state carried through its local steps.
    client_loss: ``(params, model_state, batch, ctx) -> (loss, (model_state,
      metrics))``, differentiated w.r.t. params; loss is a masked mean.
    client_step_end: ``(params, model_state, ctx) -> local_state``, after each
      real optimizer step (ctx.step is the step just taken).
    client_final: ``(end_variables, ctx) -> (update, weight, new_row)``.
    server_update: ``(server_state, aggregate, cohort_rows) ->
      server_state``. ``cohort_rows`` are the cohort's rows of the client
      table after this round's writes, [C, ...] in slot order (aligned with
      ``aggregate.client_ids``; a padding slot's row is arbitrary: mask it
      with ``aggregate.slot_mask``), or ``()`` when stateless. Never the
      whole table: where the table lives in host memory or on disk
      (client_table.py) only the cohort's rows reach the device, so a
      quantity over all N clients is kept up to date in the server extra
      (MIFA's mean of the stored updates, FedMetric's shared proxies).
    client_batches: optional, host-side (NumPy): ``(example_indices, labels,
      rng, *, num_steps, batch_size, local_epochs, local_steps) -> (idx [S, B'],
      mask [S, B'])``, the client's batch schedule; None means
      `cohort.client_batches`. FedQuad lays each step out as
      [anchors | positives | negatives_1 | negatives_2].
    cohort_batches: optional, host-side: the same schedule for a whole
      cohort at once, used by ``cohort_sampler='vectorized'``: ``(clients:
      cohort.CohortClients, labels, *, seed, round_idx, num_steps,
      batch_size, local_epochs, local_steps) -> (idx [R, S, B'], mask)``;
      None means `cohort.vectorized_batches`. An algorithm that sets
      client_batches sets this too, or runs with the per-client sampler only.

  How the methods of this library map onto the slots:

  * FedProx, FedRCL, FedSCL, SupConFL: ``client_loss`` only.
  * FedQuad, QuadrupletFL, TripletFL: ``client_loss`` and the batch
    schedules (``client_batches`` / ``cohort_batches``: each step's rows are
    anchors, positives and negatives).
  * MOON: ``init_client`` (the previous local model), ``client_loss``,
    ``client_final`` (stores the new local model in the row).
  * SCAFFOLD: ``init_client`` (control variate c_i), ``init_server`` (c),
    ``client_loss`` (adds <c - c_i, w>, whose gradient is the correction),
    ``client_final`` (new c_i from ctx.learning_rate and ctx.num_steps; the
    update carries both the model delta and the control delta),
    ``server_update``.
  * FedMetric: the server extra holds every client's latest proxy center and
    margin, broadcast in ctx.server_state; ``client_begin`` computes the
    client's center with the received model; ``client_final`` computes its
    radius and new proxy and writes them to the row; ``server_update`` copies
    the cohort's new proxies into the extra. DeepSVDD: ``client_begin`` starts
    from the client's own model in its row.
  * PMFL: the row is a ring buffer of the client's last local models,
    ``client_begin`` loads it into local_state, ``client_step_end`` pushes
    the model after every step, ``client_final`` writes it back with a weight
    from participation counters kept in the server extra; ``server_update``
    advances the counters of all N clients and mixes in past global models
    (also server extra).
  * FedAU / MIFA / FedVarp: counters or the clients' last updates live in the
    server extra or the table; ``server_update`` divides by N, not by the
    cohort's weight. MIFA and FedVarp keep the mean of the stored updates in
    the server extra, moved by the cohort's change (new minus old rows).
  * SSD: per-client scaling matrices in the server extra (made once by
    ``init_server``), picked by ctx.client_id or ctx.slot; ``client_loss``
    draws two augmented views of ``batch.raw_images`` with ctx.key;
    ``client_final`` weights by ctx.num_steps (local batches).
  """

  init_server: Callable[..., Any]
  init_client: Callable[..., Any]
  client_begin: Callable[..., Any]
  client_loss: Callable[..., Any]
  client_step_end: Callable[..., Any]
  client_final: Callable[..., Any]
  server_update: Callable[..., Any]
  client_batches: Optional[Callable[..., Any]] = None
  cohort_batches: Optional[Callable[..., Any]] = None


class RoundSpec(NamedTuple):
  """Everything static a round needs, closed over by the jitted functions.

  Attributes:
    algorithm: the `Algorithm`.
    client_optimizer: ``learning_rate -> optax.GradientTransformation``.
    learning_rate: ``round -> local learning rate`` (an optax schedule).
    preprocess: ``(images uint8 [B,H,W,C], key) -> float images``.
    seed: base of every PRNG key.
    local_epoch_decay: the local learning rate is multiplied by
      ``local_epoch_decay ** e`` in local epoch e of a round (FedRCL's
      per-epoch LambdaLR); 1.0 turns it off.
    batch_size: examples per local epoch step (the configured B), for
      counting epochs; 0 means the width of a step's rows. Differs from that
      width when an algorithm lays several rows out per example (FedQuad's
      4B-wide steps hold B anchors).
    per_client: also return each slot's loss, examples and update norm
      (the round's metrics then hold ``clients``: `engine.client_report`
      per slot, with ``client_id``), for heterogeneity studies.
    num_clients: N, the population (`Aggregate.num_clients`). 0 means the
      leading dimension of the client table, which is N only where the
      whole table is on the device; a run sets it.
  """

  algorithm: Algorithm
  client_optimizer: Callable[[Any], optax.GradientTransformation]
  learning_rate: Callable[[Any], Any]
  preprocess: Callable[..., Any]
  seed: int
  local_epoch_decay: float = 1.0
  batch_size: int = 0
  per_client: bool = False
  num_clients: int = 0


class HeldOut(NamedTuple):
  """The held-out validation split, as a server may hold it (FedPPO's
  rewards). ``preprocess(images, key)`` is the evaluation's preprocessing,
  applied by whoever reads the images."""

  images: Any  # uint8 [V, H, W, C] (NumPy)
  labels: Any  # int [V] (NumPy)
  preprocess: Callable[..., Any]


class RunFacts(NamedTuple):
  """Facts of the run (not knobs) every algorithm factory receives as ``run``.

  `assemble.build_algorithm` fills them from the config; they cannot be set
  in ``algorithm_kwargs``. A factory called directly gets ``RunFacts()``
  unless given one; a factory that needs a fact it was not given says so
  (FedAU's 'known_prob') or falls back on its paper's value (PMFL's T).

  Attributes:
    num_rounds: T, the rounds the run asks for (PMFL's psi schedule).
    num_clients: N, the client population.
    participation_probabilities: [N] each client's true participation
      probability (FedAU's ``known_prob`` aggregation), or None.
    class_counts: [N, K] each client's examples per class (FedLC's
      calibration), or None.
    validation: the `HeldOut` validation split (``dataset.
      validation_fraction > 0``; FedPPO's rewards), or None.
  """

  num_rounds: Optional[int] = None
  num_clients: Optional[int] = None
  participation_probabilities: Optional[Any] = None
  class_counts: Optional[Any] = None
  validation: Optional[HeldOut] = None


# The default ``run`` of a factory called directly (no facts known).
NO_RUN_FACTS = RunFacts()
