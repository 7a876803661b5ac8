import pyro
import pytest


@pytest.fixture
def clean_param_store():
    """An empty Pyro parameter store before and after the test (guides register their parameters there)."""
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()
