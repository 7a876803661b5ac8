"""Fixtures of the distributed tests."""

from __future__ import annotations

import pytest
import torch
import torch.distributed

from pyro_sgmcmc.distributed import free_port


@pytest.fixture
def one_rank():
    """A gloo process group of one rank for the test, destroyed after it."""
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )  # fmt: skip
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()
