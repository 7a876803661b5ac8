"""The latent sites' Normal priors in a standard form that is cheap to evaluate, above all under vmap.

Most SG-MCMC models put ``Normal`` priors on their latent sites. Evaluated as Pyro does, every site runs
``Normal.log_prob`` on broadcast parameters. Two cheaper forms give the same value (to round-off):

* :class:`StandardNormalForm` stands in for one site's ``Normal`` (possibly ``Independent``):

  .. math:: \\log p(x) = -\\tfrac12 \\sum_e \\Big(\\frac{x_e - \\mu_e}{\\sigma_e}\\Big)^2
            - \\sum_e \\big(\\log \\sigma_e + \\tfrac12 \\log 2\\pi\\big),

  skipping the subtraction for a constant zero mean and the division for a constant unit scale
  (:class:`FastNormalPriors` swaps it in at the sample statement);
* :class:`StandardPriors` adds the terms of all sites with a constant ``Normal(0, sigma_s)`` prior on a
  real (unconstrained) value in one product of the flat position :math:`z` with itself:

  .. math:: \\sum_s \\log \\mathcal{N}(z_s; 0, \\sigma_s^2) = -\\tfrac12\\, z^\\top W z
            - \\sum_s d_s \\big(\\log \\sigma_s + \\tfrac12 \\log 2\\pi\\big),
            \\qquad W = \\mathrm{diag}(\\sigma_{s(i)}^{-2}).

"Constant" means: the parameter depends on no input of the evaluation (no gradient at any level, no
vmapped chain dimension), which ``pyro_sgmcmc/_compat.py`` tells.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple

import pyro
import torch
from pyro.poutine.messenger import Messenger

from .._compat import is_batched, unwrapped_constant

__all__ = [
    "FastNormalPriors", "StandardNormalForm", "StandardPriors", "constant_scalar", "normal_base",
    "trusted_prior_constants",
]  # fmt: skip

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def is_constant(tensor: torch.Tensor) -> bool:
    """True for a tensor that depends on no input of the evaluation (see the module's docstring)."""
    return unwrapped_constant(tensor) is not None


class StandardNormalForm:
    """Stands in for a (possibly ``Independent``) ``Normal`` at a latent site in the trace.

    .. math:: \\log p(x) = -\\tfrac12 \\sum_e \\Big(\\frac{x_e - \\mu_e}{\\sigma_e}\\Big)^2
              - \\sum_e \\big(\\log \\sigma_e + \\tfrac12 \\log 2\\pi\\big)

    summed over the ``event_dims`` rightmost axes: the same value as ``Normal.log_prob`` (to round-off).
    Constant parameters (the usual fixed prior) make it cheap under :func:`torch.func.vmap`: the
    normaliser is computed on the unbatched parameters, a zero mean skips the subtraction and a unit
    scale the division, so the batched work is one square and one sum. Only ``log_prob`` (all that
    :meth:`pyro.poutine.Trace.log_prob_sum` calls) and the shapes are provided.
    """

    def __init__(self, fn, loc: torch.Tensor, scale: torch.Tensor, event_dims: int) -> None:
        self.base = fn
        self.batch_shape = fn.batch_shape
        self.event_shape = fn.event_shape
        self.loc, self.scale, self.event_dims = loc, scale, event_dims
        shape = fn.batch_shape + fn.event_shape
        self._skip_loc = is_constant(loc) and bool((loc == 0).all())
        self._skip_scale = is_constant(scale) and bool((scale == 1).all())
        log_normaliser = (scale.log() + _HALF_LOG_2PI).expand(shape)
        self._log_normaliser = log_normaliser.sum(tuple(range(-event_dims, 0))) if event_dims else log_normaliser

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        standardised = value if self._skip_loc else value - self.loc
        if not self._skip_scale:
            standardised = standardised / self.scale
        square = standardised * standardised
        if self.event_dims:
            square = square.sum(tuple(range(-self.event_dims, 0)))
        return -0.5 * square - self._log_normaliser


class FastNormalPriors(Messenger):
    """Swap the ``Normal`` prior of each named latent site for :class:`StandardNormalForm`.

    Only ``Normal`` and ``Independent(... Normal)`` with plain ``log_prob`` arguments are swapped;
    every other distribution is left as it is. A site whose distribution object is the same as at
    the previous call (a ``PyroSample`` prior built once) reuses the previous stand-in.
    """

    def __init__(self, site_names) -> None:
        super().__init__()
        self.site_names = frozenset(site_names)
        self._cache: Dict[str, tuple] = {}

    def _pyro_sample(self, msg) -> None:
        self.swap(msg)

    def swap(self, msg) -> None:
        """Put the stand-in for the site's ``Normal`` prior into ``msg["fn"]`` (nothing for other sites)."""
        if msg["name"] not in self.site_names or msg["args"] or msg["kwargs"]:
            return
        fn = msg["fn"]
        cached = self._cache.get(msg["name"])
        if cached is not None and cached[0] is fn:
            msg["fn"] = cached[1]
            return
        normal = normal_base(fn)
        if normal is None:
            return
        base, event_dims = normal
        shapes = (event_dims, fn.batch_shape, fn.event_shape)
        if cached is not None and _TRUSTED.get() and cached[2][1:] == shapes:
            # recording a step (trusted constants): the stand-in made in the eager steps is reused for a prior
            # built anew from constants; making a new one compares them with 0 and 1, a host read that a CUDA
            # graph cannot record
            if is_constant(base.loc) and is_constant(base.scale):
                msg["fn"] = cached[1]
                return
        # a prior built anew at every call from the same constants (dist.Normal(0., 1.).expand(...))
        # reuses the stand-in made for equal constants: no tensor work at all
        key = broadcast_constant_key(base.loc), broadcast_constant_key(base.scale)
        if cached is not None and key[0] is not None and key[1] is not None:
            if cached[2] == (key, *shapes):
                msg["fn"] = cached[1]
                return
        fast = StandardNormalForm(fn, base.loc, base.scale, event_dims)
        if is_constant(base.loc) and is_constant(base.scale):
            self._cache[msg["name"]] = (fn, fast, (key, event_dims, fn.batch_shape, fn.event_shape))
        msg["fn"] = fast


def broadcast_constant_key(tensor: torch.Tensor) -> Optional[tuple]:
    """``(dtype, device, value)`` for a constant tensor that holds one value broadcast over its shape
    (a scalar, or a scalar expanded: all strides of its non-trivial axes are zero), else ``None``.

    Reads the value with ``.item()`` (a device sync): for set-up and rare paths only; the per-step check
    of the standard priors reads no value (:func:`constant_scalar`, :meth:`StandardPriors.verify`)."""
    if any(stride for stride, size in zip(tensor.stride(), tensor.shape) if size > 1) or not is_constant(tensor):
        return None
    if _TRUSTED.get() and tensor.device.type != "cpu":  # recording a step: no read; the same memory, the same key
        return tensor.dtype, tensor.device, ("at", tensor.data_ptr())
    return tensor.dtype, tensor.device, tensor[(0,) * tensor.dim()].item()


def constant_scalar(tensor: torch.Tensor) -> Optional[torch.Tensor]:
    """The one value of a constant broadcast tensor (see :func:`broadcast_constant_key`) as a 0-d tensor
    that shares its storage, without reading it (no copy, no device sync); ``None`` for anything else.

    ``dist.Normal(0., 1.).expand(shape)`` holds views, all strides zero, of the 0-d tensors made from the
    Python floats: one strided view of the element at the storage offset is that value (0.6 us, where
    reading the tensor it views would save 0.65 us more per call but take a private attribute)."""
    if tensor.requires_grad:
        return None
    tensor = unwrapped_constant(tensor)  # a differentiated or vmapped tensor is not a constant
    if tensor is None:
        return None
    if tensor.dim() == 0:
        return tensor
    if not any(tensor.stride()):
        return tensor.as_strided((), ()) if tensor.numel() else None
    for stride, size in zip(tensor.stride(), tensor.shape):
        if size != 1 and (stride or not size):  # a varying axis, or no element at all
            return None
    return tensor.as_strided((), ())  # the element at the tensor's storage offset


class SiteForm(NamedTuple):
    """What a standard prior looks like at set-up: checked at every call without reading a value."""

    event_dims: int
    batch_shape: torch.Size
    event_shape: torch.Size
    loc: tuple  # (dtype, device, value)
    scale: tuple


class StandardPriors:
    """The latent sites whose prior is ``Normal(0, sigma)`` with constant ``sigma`` (possibly expanded and
    wrapped in ``Independent``) on an unconstrained (real) value, found once in set-up.

    .. math:: \\sum_s \\log \\mathcal{N}(x_s; 0, \\sigma_s^2) = -\\tfrac12 \\sum_s \\sigma_s^{-2}\\, x_s \\cdot x_s
              - \\sum_s d_s \\big(\\log \\sigma_s + \\tfrac12 \\log 2\\pi\\big)

    When all such sites are present (the usual case), this is one dot product of the flat position
    (weighted when the sites are not all of the sites or their ``sigma`` differ). At every call each site
    must still build the same prior, with unit scale and no mask, or it is evaluated the ordinary way.
    The check is in two parts, so that no value is read per site (a ``.item()`` is a device sync):
    :meth:`scalars` compares the structure as the site runs (types, shapes, dtypes, devices, broadcast
    constants) and :meth:`verify`, after the run, compares all the constants at once, in one tensor.
    """

    def __init__(self, forms: Dict[str, SiteForm], sites) -> None:
        self.forms = forms
        self.sites = frozenset(forms)
        self._last: Dict[str, tuple] = {}  # name -> (fn, its constants) of the last call
        self._expected: Dict[tuple, torch.Tensor] = {}  # deferred names, in order -> their constants
        self._on_device: Dict[tuple, torch.Tensor] = {}  # (names, dtype) -> those constants on their device
        self._members = [site for site in sites if site.name in self.sites]
        self._inverse_variance = {s.name: 1.0 / forms[s.name].scale[2] ** 2 for s in self._members}
        self._log_normaliser = {
            s.name: s.numel * (math.log(forms[s.name].scale[2]) + _HALF_LOG_2PI) for s in self._members
        }
        self._total_log_normaliser = sum(self._log_normaliser.values())
        dim = sum(site.numel for site in sites)
        inverse_variances = set(self._inverse_variance.values())
        if len(self._members) == len(sites) and len(inverse_variances) == 1:
            self._weights, self._factor = None, -0.5 * inverse_variances.pop()
        else:
            weights = torch.zeros(dim, dtype=torch.float64)
            for s in self._members:
                weights[s.slice] = self._inverse_variance[s.name]
            self._weights, self._factor = weights, -0.5
        self._cast_weights: Dict[tuple, torch.Tensor] = {}

    @classmethod
    def find(cls, trace, sites) -> "Optional[StandardPriors]":
        forms = {}
        for site in sites:
            node = trace.nodes[site.name]
            if site.has_jacobian or node["args"] or node["kwargs"]:
                continue
            signature = normal_signature(node["fn"])
            if signature is None:
                continue
            (loc, scale), event_dims, batch_shape, event_shape = signature
            if loc[2] != 0 or not (math.isfinite(scale[2]) and scale[2] > 0):
                continue
            forms[site.name] = SiteForm(event_dims, torch.Size(batch_shape), torch.Size(event_shape), loc, scale)
        return cls(forms, sites) if forms else None

    def scalars(self, msg) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """The site's ``(loc, scale)`` constants as 0-d tensors if the site builds a prior of its set-up
        form (all but the values, checked by :meth:`verify`), with unit scale and no mask; else ``None``."""
        if msg["args"] or msg["kwargs"] or msg["mask"] is not None:
            return None
        scale = msg["scale"]
        if not (isinstance(scale, (int, float)) and scale == 1.0):
            return None
        fn, name = msg["fn"], msg["name"]
        last = self._last.get(name)
        if last is not None and last[0] is fn:  # the same object as last time (a PyroSample prior)
            return last[1]
        form = self.forms[name]
        normal = normal_base(fn)
        if (
            normal is None
            or normal[1] != form.event_dims
            or fn.batch_shape != form.batch_shape
            or fn.event_shape != form.event_shape
        ):
            return None
        base = normal[0]
        loc, scale = constant_scalar(base.loc), constant_scalar(base.scale)
        # the devices are compared in verify, once for all sites
        if loc is None or scale is None or loc.dtype is not form.loc[0] or scale.dtype is not form.scale[0]:
            return None
        pair = (loc, scale)
        self._last[name] = (fn, pair)
        return pair

    def verify(self, deferred: Mapping[str, tuple], scalars: List[torch.Tensor]):
        """``None`` when the deferred sites' constants are their set-up values; else the names of the sites
        whose constants are (found site by site: a rare path).

        Constants on the CPU are read (no device sync, and cheaper than a tensor operation); on another
        device they are compared in one tensor operation, so one sync per call instead of one per site."""
        if _TRUSTED.get():
            return None
        names = tuple(deferred)
        expected = self._expected.get(names)
        if expected is None:
            expected = self._expected[names] = self._expected_constants(names)
        values, devices = expected
        if devices == _CPU_ONLY and all(scalar.is_cpu for scalar in scalars):
            if [scalar.item() for scalar in scalars] == values:
                return None
        elif devices != _CPU_ONLY:
            try:  # refuses constants on several devices: then checked site by site
                constants = torch.stack(scalars)
            except RuntimeError:
                constants = None
            if constants is not None and constants.device == devices:
                reference = self._on_device.get((names, constants.dtype))
                if reference is None:  # made once: a copy from the host per call is one more wait on a GPU
                    reference = self._on_device[(names, constants.dtype)] = constants.new_tensor(values)
                if torch.equal(constants, reference):
                    return None
        return {
            name
            for i, name in enumerate(names)
            if scalar_key(scalars[2 * i]) == self.forms[name].loc
            and scalar_key(scalars[2 * i + 1]) == self.forms[name].scale
        }

    def _expected_constants(self, names: Tuple[str, ...]) -> tuple:
        """The set-up constants of these sites, in the order of the check, and their one device (or
        ``_CPU_ONLY``; ``None`` for several devices, which then fail the fast checks)."""
        keys = [key for name in names for key in (self.forms[name].loc, self.forms[name].scale)]
        devices = {key[1] for key in keys}
        device = devices.pop() if len(devices) == 1 else None
        return [key[2] for key in keys], (_CPU_ONLY if device is not None and device.type == "cpu" else device)

    def log_prob(self, position: torch.Tensor, values: Mapping[str, torch.Tensor], names) -> torch.Tensor:
        if len(names) == len(self.sites):
            weighted = position if self._weights is None else position * self._weights_for(position)
            # one chain: one dot product; under vmap, dot's batching rule is slower than a product and a sum
            square = (weighted * position).sum() if is_batched(position) else torch.dot(weighted, position)
            return self._factor * square - self._total_log_normaliser
        total = 0.0
        for name in sorted(names):  # some sites built another prior at this call: these sites alone
            x = values[name]
            total = total + (-0.5 * self._inverse_variance[name] * (x * x).sum() - self._log_normaliser[name])
        return total

    def _weights_for(self, position: torch.Tensor) -> torch.Tensor:
        key = (position.dtype, position.device)
        if key not in self._cast_weights:
            self._cast_weights[key] = self._weights.to(dtype=position.dtype, device=position.device)
        return self._cast_weights[key]


_CPU_ONLY = "cpu"  # all of a check's constants are on the CPU
_TRUSTED = contextvars.ContextVar("trusted_prior_constants", default=False)


@contextlib.contextmanager
def trusted_prior_constants():
    """Within it :meth:`StandardPriors.verify` takes the deferred sites' constants as their set-up values without
    comparing them (a comparison on a GPU reads a value to the host). For recording a step as a CUDA graph
    (:mod:`~pyro_sgmcmc.kernels.capture`): the recorded step cannot change its constants anyway, and the eager
    step it is compared with has checked them."""
    token = _TRUSTED.set(True)
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def scalar_key(scalar: torch.Tensor) -> tuple:
    """``(dtype, device, value)`` of a 0-d tensor, as :func:`broadcast_constant_key` (reads the value)."""
    return scalar.dtype, scalar.device, scalar.item()


def normal_signature(fn) -> Optional[tuple]:
    """For a (possibly ``Independent``) ``Normal`` with constant broadcast parameters: their keys and the
    shapes; ``None`` for anything else."""
    normal = normal_base(fn)
    if normal is None:
        return None
    base, event_dims = normal
    keys = broadcast_constant_key(base.loc), broadcast_constant_key(base.scale)
    if keys[0] is None or keys[1] is None:
        return None
    return keys, event_dims, tuple(fn.batch_shape), tuple(fn.event_shape)


_NORMALS = (torch.distributions.Normal, pyro.distributions.Normal)


def normal_base(fn) -> Optional[Tuple[torch.distributions.Normal, int]]:
    """``(the Normal, event dimensions)`` for a ``Normal`` possibly wrapped in ``Independent``\\ s (the
    wrappers' reinterpreted dimensions added up); ``None`` for any other distribution."""
    base, event_dims = fn, 0
    while isinstance(base, torch.distributions.Independent):
        event_dims += base.reinterpreted_batch_ndims
        base = base.base_dist
    return (base, event_dims) if type(base) in _NORMALS else None
