import pytest
import torch


@pytest.fixture
def float64():
    """Run a test in float64 (restores the default dtype afterwards)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


@pytest.fixture
def full_data_passes(monkeypatch):
    """The full-data evaluations of the control variates' set-up and searches (each is N / B minibatch
    evaluations), counted: the list grows by one per pass."""
    from pyro_sgmcmc.kernels import control_variates

    calls = []
    original = control_variates.full_data_potential_and_grad

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(control_variates, "full_data_potential_and_grad", counted)
    return calls


# Tiny tensors: one thread avoids thread start-up costs (about 10x on a loaded 2-core machine).
torch.set_num_threads(1)

try:  # plots in tests never need a screen
    import matplotlib

    matplotlib.use("Agg")
except ImportError:  # pragma: no cover
    pass
