"""ModuleLaplace on a tiny randomly initialised BERT wrapped by PEFT's LoRA (no download; skipped without peft).

The diagonal GGN over the adapters (query and value of two layers) is compared with the exact GGN from
``torch.func`` Jacobians through the whole transformer, in float64 (tolerance at rounding, 1e-9 relative); so is
the Kronecker curvature of each adapter matrix on one token of one example, where K-FAC is exact.
"""

import pytest
import torch

from pyro_sgmcmc.guides import ModuleLaplace, is_lora_parameter

from .tiny_lora import batches, exact_ggn, exact_jacobian

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def peft_bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
        max_position_embeddings=16, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    base = transformers.BertForSequenceClassification(config)
    lora = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["query", "value"], lora_dropout=0.0)
    model = peft.get_peft_model(base, lora).double()
    with torch.no_grad():  # PEFT starts lora_B at zero, where the A block of the GGN vanishes: a trained-like point
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.5)
    model.eval()
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 30, (12, 6), generator=generator)
    mask = (torch.arange(6) < torch.randint(3, 7, (12,), generator=generator).unsqueeze(1)).long()
    labels = torch.randint(0, 3, (12,), generator=generator)
    return model, {"input_ids": ids, "attention_mask": mask}, labels


def _logits_only(model):
    class Logits(torch.nn.Module):  # functional_call needs a module whose output is the logits tensor
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, **inputs):
            return self.inner(**inputs).logits

    return Logits()


def test_diag_ggn_of_peft_adapters_is_the_diagonal_of_the_exact_ggn(peft_bert):
    model, inputs, labels = peft_bert
    names = [name for name, p in model.named_parameters() if is_lora_parameter(name, p)]
    assert len(names) == 8
    laplace = ModuleLaplace(model, is_lora_parameter, curvature="diag_ggn").fit(batches(inputs, labels, 5))
    wrapped = _logits_only(model)
    exact = exact_ggn(wrapped, ["inner." + n for n in names], inputs)
    torch.testing.assert_close(laplace.precision.curvature, exact.diagonal(), rtol=1e-9, atol=1e-12)


def test_kron_laplace_lora_end_to_end_leaves_the_base_untouched(peft_bert):
    model, inputs, labels = peft_bert
    before = {name: value.clone() for name, value in model.state_dict().items()}
    laplace = ModuleLaplace(model, is_lora_parameter, curvature="kron", kron_rank=3, position_mask="attention_mask")
    laplace.fit(batches(inputs, labels, 5))
    laplace.optimize_prior_precision(mode="parameter")
    prediction = laplace.predict(inputs, batch_size=5)
    names = ["inner." + n for n in laplace.names]
    jacobian = exact_jacobian(_logits_only(model), names, inputs)
    expected = jacobian @ laplace.posterior_precision.covariance() @ jacobian.transpose(1, 2)
    torch.testing.assert_close(prediction.covariance, expected, rtol=1e-9, atol=1e-12)
    probs = laplace.predict(inputs, link="probit")
    torch.testing.assert_close(probs.sum(-1), torch.ones(12, dtype=torch.float64))
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())


def test_kron_of_peft_adapters_is_the_exact_ggn_block_for_one_token(peft_bert):
    """For one example of one token every adapter matrix acts on one input vector a with one output gradient, so its
    GGN block is exactly ``(J_y^T H J_y) (x) (a a^T)``: the untruncated Kronecker curvature must equal the exact GGN's
    block of each adapter matrix (through the whole transformer, float64, 1e-9 relative), and it keeps no block
    between matrices (the cross blocks of the exact GGN are not zero: the Kronecker curvature is block-diagonal)."""
    model, inputs, labels = peft_bert
    one = {key: value[:1, :1] for key, value in inputs.items()}
    laplace = ModuleLaplace(model, is_lora_parameter, curvature="kron").fit(batches(one, labels[:1], 1))
    laplace.set_prior_precision(1.0)
    dim = laplace.loc.numel()
    curvature = laplace.posterior_precision.dense() - torch.eye(dim, dtype=torch.float64)
    exact = exact_ggn(_logits_only(model), ["inner." + n for n in laplace.names], one)
    for block in laplace.slices.values():
        torch.testing.assert_close(curvature[block, block], exact[block, block], rtol=1e-9, atol=1e-12)
    inside = torch.zeros_like(exact, dtype=torch.bool)
    for block in laplace.slices.values():
        inside[block, block] = True
    # the comparison is not vacuous: the value adapters' blocks are far above the tolerance's 1e-12 (about 1e-7:
    # the small initial weights give logits near zero; the query's blocks vanish at one token, whose attention
    # weight is 1 whatever the query), and the blocks left out are really there
    assert max(float(exact[b, b].abs().max()) for n, b in laplace.slices.items() if "value" in n) > 1e-9
    assert float(exact[~inside].abs().max()) > 1e-9
