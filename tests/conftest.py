import pytest
import torch


@pytest.fixture
def float64():
    """Run a test in float64 (restores the default dtype afterwards)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


# Tiny tensors: one thread avoids thread start-up costs (about 10x on a loaded 2-core machine).
torch.set_num_threads(1)

try:  # plots in tests never need a screen
    import matplotlib

    matplotlib.use("Agg")
except ImportError:  # pragma: no cover
    pass
