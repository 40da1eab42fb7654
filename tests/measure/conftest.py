"""One intra-op thread for these CPU tests: on a shared 2-core machine torch's thread pool
otherwise stalls on busy cores and the small reference-kernel calls run several times slower."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
