"""Subset-of-weights Laplace: a Gaussian over chosen sites, the others fixed at the MAP.

With the latent vector split as :math:`\\theta = (\\theta_S, \\theta_F)`, the approximation is

.. math::
    p(\\theta \\mid y) \\approx \\mathcal N\\big(\\theta_S; \\theta_{S*}, \\Lambda_S^{-1}\\big)\\,
    \\delta(\\theta_F - \\theta_{F*}),

:math:`\\Lambda_S` the curvature of the conditional model :math:`p(y, \\theta_S \\mid \\theta_{F*})`
(any :class:`~pyro_sgmcmc.guides.curvature.Curvature`; for a network's last layer the GGN is cheap
and ``"full_ggn"`` often fits). The evidence is that of the conditional model: laplace-torch's
last-layer evidence. The fixed sites are removed from the model seen by the curvature sweep by
conditioning them on their MAP values and hiding them from outer handlers
(:func:`fix_sites`), so every curvature path runs unchanged on the smaller latent vector.

``subset_of_weights="last_layer"`` picks the weight and bias of the last ``F.linear`` call (an
``nn.Linear`` of a ``PyroModule``) that uses a latent site, as laplace-torch picks the last
``nn.Linear`` of a network.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Union

import pyro.poutine as poutine
import torch

from .curvature.linear import LinearRecorder

__all__ = ["SUBSETS", "check_subset", "fix_sites", "last_layer_sites", "subset_names"]

#: The named subsets accepted by ``subset_of_weights``.
SUBSETS = ("all", "last_layer")

Subset = Union[str, Sequence[str]]


def check_subset(value) -> Subset:
    """``"all"``, ``"last_layer"`` or a non-empty list/tuple of site names."""
    if isinstance(value, str):
        if value not in SUBSETS:
            raise ValueError(
                f"subset_of_weights must be 'all', 'last_layer' or a list of latent site names; got {value!r}"
            )
        return value
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(
            f"subset_of_weights must be 'all', 'last_layer' or a non-empty list of latent site names; got {value!r}"
        )
    if len(set(value)) != len(value):
        raise ValueError(f"subset_of_weights names a site twice: {list(value)!r}")
    return tuple(value)


def fix_sites(model, values: Dict[str, torch.Tensor]):
    """``model`` with the sites ``values`` set to those values and hidden from outer handlers.

    Outer traces (and so the curvature sweep, the potential and the Laplace guide) see a model
    whose latent sites are the other ones only.
    """
    if not values:
        return model
    return poutine.block(poutine.condition(model, data=values), hide=list(values))


def last_layer_sites(model, values: Dict[str, torch.Tensor], args, kwargs) -> List[str]:
    """The weight and bias sites of the last ``F.linear`` call that uses a latent site.

    ``values`` are the constrained latent values (the MAP) the model is run at.
    """
    recorder = LinearRecorder({id(value): name for name, value in values.items()})
    with torch.no_grad(), recorder:
        poutine.trace(poutine.condition(model, data=values)).get_trace(*args, **kwargs)
    if not recorder.calls:
        raise ValueError(
            "subset_of_weights='last_layer' needs a network whose layers are F.linear calls (nn.Linear in a "
            "PyroModule with PyroSample weight and bias); none of the model's latent sites is used by one. "
            "Pass the sites by name: subset_of_weights=['site', ...]"
        )
    weight, bias, _, _ = recorder.calls[-1]
    return [name for name in (weight, bias) if name is not None]


def subset_names(subset: Subset, all_names: Sequence[str], model, values, args, kwargs) -> List[str]:
    """The chosen sites in the guide's order (``all_names``), checked."""
    if subset == "all":
        return list(all_names)
    chosen = last_layer_sites(model, values, args, kwargs) if subset == "last_layer" else list(subset)
    unknown = sorted(set(chosen) - set(all_names))
    if unknown:
        raise ValueError(f"subset_of_weights names unknown sites {unknown}; latent sites: {list(all_names)}")
    return [name for name in all_names if name in chosen]
