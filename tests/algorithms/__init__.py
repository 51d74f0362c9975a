"""Tests of the algorithms, one module per fedjax_metric/algorithms/ module:
test_<name>.py tests fedjax_metric/algorithms/<name>.py.

A package (this file), so that pytest imports its modules as
``algorithms.test_<name>`` with tests/ on sys.path (its 'prepend' import
mode inserts the first folder above without an ``__init__.py``): their
imports of tests/' own helpers (``import fl_fixtures``) resolve as in
tests/, their names cannot clash with those of tests/' modules, and the
helpers they share are imported relatively (``from .ssl_helpers import``;
from tests/, ``from algorithms.oneclass_helpers import``). tests/conftest.py
applies here too; this folder needs no conftest.py of its own.
"""
