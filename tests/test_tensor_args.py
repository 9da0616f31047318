"""Bad tensors are refused before any launch, with the argument named."""
from __future__ import annotations

import numpy as np
import pytest

from kvforge.runtime.tensors import device_view, is_c_contiguous


def test_a_non_array_is_a_type_error_naming_the_argument():
    with pytest.raises(TypeError, match=r"src: expected a CUDA array .* got list"):
        device_view([1, 2, 3], "src")


def test_a_host_array_is_refused_naming_the_argument():
    with pytest.raises((ValueError, TypeError), match=r"^out: "):
        device_view(np.arange(4, dtype=np.uint32), "out", dtype="uint32")


@pytest.mark.parametrize("shape,strides,ok", [
    ((4, 8), None, True), ((4, 8), (8, 1), True), ((4, 8), (1, 4), False), ((4, 1), (1, 7), True),
    ((2, 3, 4), (12, 4, 1), True), ((2, 3, 4), (24, 4, 1), False),
])
def test_contiguity_rule(shape, strides, ok):
    assert is_c_contiguous(shape, strides) is ok
