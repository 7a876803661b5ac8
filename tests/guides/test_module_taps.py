"""Curvatures of ModuleLaplace on hand-written LoRA adapters against the exact GGN (dense, by torch.func).

Everything runs in float64, so the identities hold to rounding: tolerances 1e-10 relative.
"""

import pytest
import torch

from pyro_sgmcmc.guides import ModuleLaplace

from .tiny_lora import TinyLoRAClassifier, batches, exact_ggn, lora_names, tiny_data

pytestmark = pytest.mark.usefixtures("float64")


@pytest.fixture
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _model_and_data(num=20, length=5):
    model = TinyLoRAClassifier().double()
    inputs, labels = tiny_data(num=num, length=length)
    return model, inputs, labels


def _block(matrix, where):
    return matrix[where, where]


def test_diag_ggn_is_the_diagonal_of_the_exact_ggn():
    model, inputs, labels = _model_and_data()
    names = lora_names(model)
    assert 90 <= sum(dict(model.named_parameters())[n].numel() for n in names) <= 400
    laplace = ModuleLaplace(model, names, curvature="diag_ggn").fit(batches(inputs, labels, 7))
    exact = exact_ggn(model, names, inputs)
    torch.testing.assert_close(laplace.precision.curvature, exact.diagonal(), rtol=1e-10, atol=1e-12)


def test_full_ggn_equals_the_exact_ggn():
    model, inputs, labels = _model_and_data()
    names = lora_names(model)
    laplace = ModuleLaplace(model, names, curvature="full_ggn").fit(batches(inputs, labels, 6))
    torch.testing.assert_close(laplace.precision.curvature, exact_ggn(model, names, inputs), rtol=1e-10, atol=1e-12)


def test_last_layer_full_ggn_equals_the_exact_ggn():
    """A last layer (the head's frozen base weight and bias) as the latent parameters."""
    model, inputs, labels = _model_and_data()
    names = ["head.base.weight", "head.base.bias"]
    laplace = ModuleLaplace(model, names, curvature="full_ggn").fit(batches(inputs, labels, 20))
    torch.testing.assert_close(laplace.precision.curvature, exact_ggn(model, names, inputs), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kfac", ["expand", "reduce"])
def test_kron_is_exact_for_one_example_with_one_token(kfac):
    """With N = 1 and T = 1 the weight block sum_k (delta_k a^T)(delta_k a^T)^T is G (x) a a^T exactly."""
    model, inputs, labels = _model_and_data(num=1, length=1)
    names = lora_names(model)
    laplace = ModuleLaplace(model, names, curvature="kron", kfac=kfac).fit([(inputs, labels)])
    exact = exact_ggn(model, names, inputs)
    dense = laplace.precision.with_prior(torch.zeros(exact.shape[0], dtype=torch.float64)).dense()
    for name, where in laplace.slices.items():
        torch.testing.assert_close(_block(dense, where), _block(exact, where), rtol=1e-10, atol=1e-12)


def _output_gradients(model, names, inputs):
    """delta[layer] = d r_nk / d z_nt, (K, n, T, out), from torch.func with a shift added to each layer's output."""
    layers = sorted({name.rpartition(".")[0] for name in names})
    shapes = {}
    handles = [model.get_submodule(p).register_forward_hook(lambda m, a, out, p=p: shapes.update({p: out.shape}))
               for p in layers]  # fmt: skip
    logits0 = model(**inputs)
    for h in handles:
        h.remove()
    p = torch.softmax(logits0.detach(), -1)

    def rows(shifts):
        hooks = [model.get_submodule(path).register_forward_hook(lambda m, a, out, s=s: out + s)
                 for path, s in zip(layers, shifts)]  # fmt: skip
        try:
            logits = model(**inputs)
        finally:
            for h in hooks:
                h.remove()
        logits = torch.log_softmax(logits, -1)
        return p.sqrt() * (logits - (p * logits).sum(-1, keepdim=True))  # the whitened GGN rows

    shifts = tuple(torch.zeros(shapes[path]) for path in layers)
    jac = torch.func.jacrev(rows)(shifts)  # per layer: (n, K, n, *out shape)
    n = logits0.shape[0]
    out = {}
    for path, j in zip(layers, jac):
        j = j.reshape(n, j.shape[1], n, -1, j.shape[-1])
        own = torch.stack([j[i, :, i] for i in range(n)], 1)  # (K, n, T, out): example i's rows on its own outputs
        out[path] = own
    return out


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kfac", ["expand", "reduce"])
def test_kron_factors_are_the_kfac_closed_form(kfac, masked):
    """Over 20 examples of 5 tokens (padding included), G and A equal the K-FAC formulas of module_taps.

    expand: G = sum_{n,k,t} delta delta^T, A = sum_{n,t} a a^T / (N T); reduce: G = sum_{n,k} (sum_t delta)(...)^T,
    A = sum_n abar abar^T / N. delta comes from torch.func here (a shift on each layer's output), not from hooks.
    With position_mask="attention_mask" the padded positions w = 0 leave A (and its count) for the token layer
    (mix); the head sees one pooled position per example and is not masked.
    """
    model, inputs, labels = _model_and_data()
    names = lora_names(model)
    mask = "attention_mask" if masked else None
    laplace = ModuleLaplace(model, names, curvature="kron", kfac=kfac, position_mask=mask)
    laplace.fit(batches(inputs, labels, 8))
    deltas = _output_gradients(model, names, inputs)
    layer_inputs = {}
    handles = [model.get_submodule(n.rpartition(".")[0]).register_forward_hook(
        lambda m, a, out, n=n: layer_inputs.update({n: a[0].reshape(a[0].shape[0], -1, a[0].shape[-1])}))
        for n in names]  # fmt: skip
    model(**inputs)
    for h in handles:
        h.remove()
    for name in names:
        delta, a = deltas[name.rpartition(".")[0]], layer_inputs[name]
        w = torch.ones(a.shape[:2])
        if masked and name.startswith("mix"):
            w = inputs["attention_mask"].double()
            assert (w == 0).any()  # padding present: the masked factor differs from the unmasked one
        if kfac == "expand":
            g = torch.einsum("knto,kntp->op", delta, delta)
            cov = torch.einsum("nt,nti,ntj->ij", w, a, a) / w.sum()
        else:
            summed = delta.sum(2)
            g = torch.einsum("kno,knp->op", summed, summed)
            mean = torch.einsum("nt,nti->ni", w, a) / w.sum(1, keepdim=True)
            cov = mean.T @ mean / a.shape[0]
        got = laplace.precision.factors[name]
        torch.testing.assert_close(got[0], g, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got[1], cov, rtol=1e-10, atol=1e-12)


def test_kron_bias_block_is_exact():
    """A last layer with a bias: the bias block sum_n sum_k delta delta^T is the exact GGN block for any N."""
    model, inputs, labels = _model_and_data()
    names = ["head.base.weight", "head.base.bias"]
    laplace = ModuleLaplace(model, names, curvature="kron").fit(batches(inputs, labels, 8))
    exact = exact_ggn(model, names, inputs)
    where = laplace.slices["head.base.bias"]
    torch.testing.assert_close(laplace.precision.factors["head.base.bias"][0], exact[where, where], rtol=1e-10,
                               atol=1e-12)  # fmt: skip
