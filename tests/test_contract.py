"""fedjax_metric/contract.py: the types an algorithm and the engine
exchange. Their field order and defaults are relied on elsewhere: a
checkpoint holds `ServerState` as a tuple and is read back by position
(restore.py, workdir.open_checkpoints), an `Algorithm` or `RoundSpec` built
without its optional fields gets the engine's defaults, and a factory
called directly gets `NO_RUN_FACTS`. Pure Python: nothing is compiled."""

import re

import jax
import jax.numpy as jnp
import pytest

from fedjax_metric import contract, engine

TYPES = (
  contract.ServerState,
  contract.Batch,
  contract.ClientContext,
  contract.Aggregate,
  contract.Algorithm,
  contract.RoundSpec,
  contract.HeldOut,
  contract.RunFacts,
)


def test_server_state_is_read_back_from_a_checkpoint_by_position():
  assert contract.ServerState._fields == (
    'variables',
    'opt_state',
    'round',
    'extra',
  )
  state = contract.ServerState({'w': jnp.ones(2)}, (), jnp.int32(4))
  assert state.extra == ()
  # What a checkpoint holds (a tuple's leaves), rebuilt as restore.py does.
  saved = tuple(jax.tree.map(lambda x: x * 2, state))
  again = engine.ServerState(*saved)
  assert int(again.round) == 8 and again.variables['w'].tolist() == [2, 2]


def test_optional_fields_default_to_the_engines_plain_behaviour():
  assert contract.Algorithm._field_defaults == dict(
    client_batches=None, cohort_batches=None
  )
  assert contract.RoundSpec._field_defaults == dict(
    local_epoch_decay=1.0, batch_size=0, per_client=False, num_clients=0
  )
  assert contract.Aggregate._field_defaults == dict(num_clients=0)
  assert contract.ServerState._field_defaults == dict(extra=())
  # Every fact unknown unless the run gives it.
  assert contract.RunFacts._field_defaults == dict.fromkeys(
    contract.RunFacts._fields
  )
  assert contract.NO_RUN_FACTS == contract.RunFacts()
  for required in (contract.ClientContext, contract.Batch, contract.HeldOut):
    assert not required._field_defaults, required.__name__


@pytest.mark.parametrize(
  'kind',
  [
    contract.ClientContext,
    contract.Algorithm,
    contract.RoundSpec,
    contract.RunFacts,
  ],
  ids=lambda t: t.__name__,
)
def test_the_attributes_a_docstring_lists_are_the_fields(kind):
  """The types whose docstrings list their attributes (what an algorithm's
  author reads) list each field, and none it lacks: a rename shows up here,
  not in a reader's lookup."""
  doc = kind.__doc__
  assert 'Attributes:' in doc
  listed = re.findall(
    r'^    ([a-z_]+(?:, [a-z_]+)*): ', doc.split('Attributes:')[1], re.M
  )
  names = {n for entry in listed for n in entry.split(', ')}
  assert names == set(kind._fields), kind.__name__


def test_the_engine_reexports_the_contracts_types():
  for kind in TYPES[:6]:
    assert getattr(engine, kind.__name__) is kind
