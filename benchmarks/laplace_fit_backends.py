"""Benchmark: the Laplace fit at 288,010 weights, ours against each laplace-torch curvature backend.

``docs/laplace.rst`` compared our ``diag_ggn`` sweep with laplace-torch's *default* backend
(``CurvlinopsGGN``, 111 s for the diagonal). laplace-torch also ships BackPACK (``BackPackGGN``) and
ASDL (``AsdlGGN``) backends, much faster for the diagonal. The network and data are those of
``benchmarks/laplace_speed.py``'s predictive part: an MLP ``64 -> 500 -> 500 -> 10`` (tanh, 288,010
weights) at a draw of its prior, 1,347 digits in minibatches of 100, Categorical likelihood (exact
GGN). Timed, interleaved over ``--repeats`` rounds (each round runs every fit once, after one
warm-up round), medians in seconds:

* ours: ``AutoLaplace(curvature="diag_ggn" | "kron").laplace_approximation(x, y)``;
* laplace-torch: ``Laplace(net, "classification", hessian_structure="diag" | "kron",
  backend=...).fit(loader)`` for ``BackPackGGN`` and ``AsdlGGN`` (``--with-default`` adds the default
  ``CurvlinopsGGN``: two minutes per diagonal fit).

The diagonal curvatures of all the libraries are checked equal (relative 1e-4, float32) on the
same weights. Skipped without laplace-torch (or a backend's package). One torch thread.

Run::

    python benchmarks/laplace_fit_backends.py            # a few minutes
    python benchmarks/laplace_fit_backends.py --tiny     # seconds

Writes ``benchmarks/laplace_fit_backends_results.json`` (``--out``).
"""

from __future__ import annotations

import statistics
import time
import warnings
from pathlib import Path

import pyro
import torch
from pyro.infer.autoguide.initialization import init_to_sample

from pyro_sgmcmc.guides import AutoLaplace

if __package__:  # imported as benchmarks.laplace_fit_backends
    from . import harness
    from .laplace_digits import load_data
    from .laplace_speed import WideMlp
else:  # run as a script: benchmarks/ is on sys.path
    import harness
    from laplace_digits import load_data
    from laplace_speed import WideMlp


def sequential_from(params: dict, hidden: int) -> torch.nn.Sequential:
    net = torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
        torch.nn.Linear(hidden, 10),
    )  # fmt: skip
    with torch.no_grad():
        for number, index in enumerate((0, 2, 4)):
            net[index].weight.copy_(params[f"layers.{number}.weight"])
            net[index].bias.copy_(params[f"layers.{number}.bias"])
    return net


def fits(args) -> dict:
    """``{name: callable returning the diagonal curvature or None}``, ours first."""
    data = load_data(0, args.tiny)
    x, y = data["x"], data["y"]
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    net = WideMlp(args.hidden)
    start = AutoLaplace(net, init_loc_fn=init_to_sample, disable_progbar=True)
    start(x, y)
    params = {name: value.detach() for name, value in start.median().items()}
    runs = {}
    for curvature in ("diag_ggn", "kron"):
        def ours(curvature=curvature):
            pyro.clear_param_store()
            guide = AutoLaplace(WideMlp(args.hidden), curvature=curvature, map_values=params, disable_progbar=True)
            laplace = guide.laplace_approximation(x, y)
            if curvature != "diag_ggn":
                return None
            return torch.cat([laplace.likelihood_curvature[where] for where in laplace.site_slices.values()])

        runs[f"ours {curvature}"] = ours
    try:
        import laplace as laplace_torch
        from laplace.curvature import AsdlGGN, BackPackGGN, CurvlinopsGGN
    except ImportError:
        return runs
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=100)
    backends = {"BackPackGGN": BackPackGGN, "AsdlGGN": AsdlGGN}
    if args.with_default:
        backends["CurvlinopsGGN (default)"] = CurvlinopsGGN
    for label, backend in backends.items():
        for structure in ("diag", "kron"):
            def theirs(backend=backend, structure=structure):
                la = laplace_torch.Laplace(
                    sequential_from(params, args.hidden), "classification", subset_of_weights="all",
                    hessian_structure=structure, backend=backend, prior_precision=1.0,
                )  # fmt: skip
                la.fit(loader)
                return la.H.detach() if structure == "diag" else None

            runs[f"laplace-torch {structure} {label}"] = theirs
    return runs


def parse_args(argv=None):
    parser = harness.parser(__doc__, Path(__file__).with_name("laplace_fit_backends_results.json"))
    parser.add_argument("--hidden", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--with-default", action="store_true", help="also laplace-torch's default CurvlinopsGGN")
    args = parser.parse_args(argv)
    if args.tiny:
        args.hidden, args.repeats = 20, 1
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pyro.validation_enabled(False), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return run(args)
    finally:
        torch.set_num_threads(threads)


def run(args) -> dict:
    runs = fits(args)
    diagonals = {name: fn() for name, fn in runs.items()}  # the warm-up round, and the curvatures to compare
    reference = diagonals["ours diag_ggn"]
    agreement = {
        name: float(((value - reference).abs() / reference.abs().clamp(min=1e-6)).max())
        for name, value in diagonals.items()
        if value is not None and name != "ours diag_ggn"
    }
    seconds = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            begin = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - begin)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    for name, value in medians.items():
        print(f"{name:40s} {value:8.2f} s", flush=True)
    print("largest relative difference of each diagonal to ours:", agreement)
    results = {
        "config": {k: (v.name if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": harness.machine_info(load=harness.load_average()),
        "num_weights": int(reference.numel()),
        "median_seconds": medians,
        "seconds": seconds,
        "diagonal_max_relative_difference": agreement,
    }
    harness.write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
