"""PyCUTLASS 2.11 unit-test configurations (tests/pycutlass211_cases.py), run
through the testbeds: float64 references, NaN-poisoned outputs, odd sizes, serial and parallel split-K, random
groups with degenerate problems."""
from __future__ import annotations

import pytest

from pycutlass.test import TestbedGrouped, test_all_conv2d, test_all_gemm
from tests.pycutlass211_cases import CONVS, GEMMS, GROUPED

from .conftest import precompile_module

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    precompile_module([*GEMMS.values(), *CONVS.values(), *GROUPED.values()], [])


@pytest.mark.parametrize("name", sorted(GEMMS))
def test_gemm_universal_testbed(name):
    assert test_all_gemm(GEMMS[name], "universal")


@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv2d_testbed(name):
    assert test_all_conv2d(CONVS[name])


@pytest.mark.parametrize("name", sorted(GROUPED))
def test_grouped_testbed(name):
    assert TestbedGrouped(GROUPED[name]).run(24)
