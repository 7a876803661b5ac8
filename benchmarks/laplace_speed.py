"""Benchmark: the speed questions of issue #18, measured (MAP fit step, GLM predictive at scale).

1. **MAP fit step** on the digits network of ``benchmarks/laplace_digits.py`` (64-32-10 tanh,
   2,410 weights, minibatches of 100 of 1,347 images), milliseconds per step, median of
   ``--repeats`` rounds of ``--steps`` steps:

   * ``svi``: ``SVI(model, AutoLaplace(model), pyro.optim.Adam, Trace_ELBO())`` (Pyro's validation
     off, as in the benchmarks);
   * ``fit_map``: ``AutoLaplace.fit_map(x, y, num_steps=..., jit_compile=True)``, the guide's MAP
     fit on the package's compiled potential (one call per round: it compiles once per call);
   * ``compiled potential``: the package's ``ModelPotential(model, jit_compile=True)``
     ``potential_and_grad`` on the flat vector with ``torch.optim.Adam``, the kernels' route;
   * ``torch loop``: a hand-written ``nn.Sequential`` + cross-entropy (sum times ``N / B``) + the
     Gaussian prior as ``0.5 * ||theta||^2`` + ``torch.optim.Adam``;
   * then one whole fit of ``--fit-steps`` steps (3,000: the digits benchmark's MAP) each for
     ``svi``, ``fit_map`` and the torch loop, seconds.

2. **GLM predictive at scale**: an MLP ``64 -> H -> H -> 10`` (``--hidden``; 500 gives 288,010
   weights), the diagonal and Kronecker Laplace at a random point of the prior on 1,347 inputs,
   then the predictive's mean and covariance for ``--num-test`` inputs (probit link), ours
   (``laplace.predict``) against laplace-torch's ``la(x, pred_type="glm")`` on the same weights
   when it is installed, both in chunks of 32 inputs (laplace-torch on all 450 at once ran out of
   23 GB here). Seconds, median of ``--predict-repeats``.

One torch thread (``--threads``). Run::

    python benchmarks/laplace_speed.py            # a few minutes
    python benchmarks/laplace_speed.py --tiny     # seconds

Writes ``benchmarks/laplace_speed_results.json`` (``--out``).
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide.initialization import init_to_sample
from pyro.nn import PyroModule, PyroSample

from pyro_sgmcmc import ModelPotential
from pyro_sgmcmc.guides import AutoLaplace

if __package__:  # imported as benchmarks.laplace_speed
    from . import harness
    from .laplace_digits import Mlp, load_data, logits_fn
else:  # run as a script: benchmarks/ is on sys.path
    import harness
    from laplace_digits import Mlp, load_data, logits_fn


# ---------------------------------------------------------------------------------- 1. MAP step
def map_step_times(args) -> dict:
    data = load_data(0, args.tiny)
    x, y = data["x"], data["y"]
    n, batch = len(y), args.batch_size
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    net = Mlp(args.digits_hidden, batch)
    guide = AutoLaplace(net, init_loc_fn=init_to_sample, disable_progbar=True)
    svi = SVI(net, guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
    svi.step(x, y)

    def run_svi():
        for _ in range(args.steps):
            svi.step(x, y)

    def run_fit_map():
        guide.fit_map(x, y, num_steps=args.steps, jit_compile=True)

    potential = ModelPotential(net, (x, y), jit_compile=True)
    z = potential.initial_position().clone().requires_grad_(False)
    theta = torch.nn.Parameter(z)
    optimizer = torch.optim.Adam([theta], lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    (plate,) = potential.subsample_plates

    def run_potential():
        for _ in range(args.steps):
            index = torch.randperm(n, generator=generator)[:batch]
            _, grad = potential.potential_and_grad(theta.detach(), {plate.name: index})
            theta.grad = grad
            optimizer.step()

    run_potential()  # compiles on the first minibatch
    torch.manual_seed(0)
    sequential = torch.nn.Sequential(
        torch.nn.Linear(64, args.digits_hidden), torch.nn.Tanh(), torch.nn.Linear(args.digits_hidden, 10)
    )
    torch_optimizer = torch.optim.Adam(sequential.parameters(), lr=1e-2)

    def run_torch():
        run_torch_steps(args.steps)

    def run_torch_steps(count):
        for _ in range(count):
            index = torch.randperm(n, generator=generator)[:batch]
            torch_optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(sequential(x[index]), y[index], reduction="sum") * (n / batch)
            loss = loss + 0.5 * sum((p**2).sum() for p in sequential.parameters())
            loss.backward()
            torch_optimizer.step()

    results = {}
    timed = [
        ("svi", run_svi),
        ("fit_map", run_fit_map),
        ("compiled potential", run_potential),
        ("torch loop", run_torch),
    ]
    for name, fn in timed:
        results[name] = 1e3 * harness.median_seconds(fn, args.repeats) / args.steps
    results["compiled"] = bool(potential.compiled)
    # a whole fit of --fit-steps steps (fit_map's one-off compilation included), seconds
    results["whole_fit_steps"] = args.fit_steps
    for name, fn in [
        ("whole_fit_s_svi", lambda: [svi.step(x, y) for _ in range(args.fit_steps)]),
        ("whole_fit_s_fit_map", lambda: guide.fit_map(x, y, num_steps=args.fit_steps, jit_compile=True)),
        ("whole_fit_s_torch_loop", lambda: [run_torch_steps(1) for _ in range(args.fit_steps)]),
    ]:
        results[name] = harness.median_seconds(fn, 1)
    return results


# ---------------------------------------------------------------------------------- 2. predictive
class WideMlp(PyroModule):
    def __init__(self, hidden: int):
        super().__init__()
        sizes = [(64, hidden), (hidden, hidden), (hidden, 10)]
        self.layers = PyroModule[torch.nn.ModuleList]([PyroModule[torch.nn.Linear](a, b) for a, b in sizes])
        for layer, (a, b) in zip(self.layers, sizes):
            layer.weight = PyroSample(dist.Normal(0.0, a**-0.5).expand([b, a]).to_event(2))
            layer.bias = PyroSample(dist.Normal(0.0, 1.0).expand([b]).to_event(1))

    def logits(self, x):
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))
        return self.layers[-1](x)

    def forward(self, x, y):
        plate = pyro.plate("data", len(x), subsample_size=min(100, len(x)))
        logits = self.logits(x[plate.indices])
        with plate:
            pyro.sample("y", dist.Categorical(logits=logits), obs=y[plate.indices])


def predictive_times(args) -> dict:
    data = load_data(0, args.tiny)
    x, y, x_test = data["x"], data["y"], data["x_test"][: args.num_test]
    results = {}
    try:
        import laplace as laplace_torch
    except ImportError:
        laplace_torch = None
    for curvature, structure in [("diag_ggn", "diag"), ("kron", "kron")]:
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        net = WideMlp(args.hidden)
        guide = AutoLaplace(net, curvature=curvature, init_loc_fn=init_to_sample, disable_progbar=True)
        guide(x, y)
        start = time.perf_counter()
        laplace = guide.laplace_approximation(x, y)
        fit = time.perf_counter() - start
        laplace.set_prior_precision(1.0)
        row = {"num_weights": int(laplace.loc.numel()), "fit_s": fit}
        print(curvature, "fit", fit, flush=True)
        row["predict_s"] = harness.median_seconds(
            lambda: laplace.predict(logits_fn(net), x_test, link="probit", batch_size=32), args.predict_repeats
        )
        if laplace_torch is not None:
            params = laplace.params()
            sequential = torch.nn.Sequential(
                torch.nn.Linear(64, args.hidden), torch.nn.Tanh(), torch.nn.Linear(args.hidden, args.hidden),
                torch.nn.Tanh(), torch.nn.Linear(args.hidden, 10),
            )  # fmt: skip
            with torch.no_grad():
                for number, index in enumerate((0, 2, 4)):
                    sequential[index].weight.copy_(params[f"layers.{number}.weight"])
                    sequential[index].bias.copy_(params[f"layers.{number}.bias"])
            la = laplace_torch.Laplace(
                sequential, "classification", subset_of_weights="all", hessian_structure=structure, prior_precision=1.0
            )
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=100)
            start = time.perf_counter()
            la.fit(loader)
            row["laplace_torch_fit_s"] = time.perf_counter() - start

            def their_predict():  # in chunks of 32 inputs, as ours: all 450 at once needs > 20 GB
                with torch.no_grad():
                    chunks = [x_test[i : i + 32] for i in range(0, len(x_test), 32)]
                    return torch.cat([la(chunk, pred_type="glm", link_approx="probit") for chunk in chunks])

            row["laplace_torch_predict_s"] = harness.median_seconds(their_predict, args.predict_repeats)
            ours = laplace.predict(logits_fn(net), x_test, link="probit", batch_size=32)
            row["max_abs_probability_difference"] = float((ours - their_predict()).abs().max())
        row["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
        results[curvature] = row
        print(curvature, json.dumps(row), flush=True)
    return results


def parse_args(argv=None):
    parser = harness.parser(__doc__, Path(__file__).with_name("laplace_speed_results.json"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fit-steps", type=int, default=3000, help="steps of the whole-fit timing")
    parser.add_argument("--skip-predictive", action="store_true")
    parser.add_argument("--predict-repeats", type=int, default=1, help="rounds of the predictive timings")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--digits-hidden", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=500, help="width of the predictive benchmark's MLP")
    parser.add_argument("--num-test", type=int, default=450)
    args = parser.parse_args(argv)
    if args.tiny:
        args.steps, args.repeats, args.hidden, args.num_test, args.fit_steps = 20, 1, 20, 50, 50
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    pyro.enable_validation(False)
    results = {"config": {k: (v.name if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    results["config"]["torch"] = torch.__version__
    results["context"] = harness.run_context()
    print(harness.context_line(results["context"]), flush=True)
    results["map_step_ms"] = map_step_times(args)
    print("MAP step (ms):", json.dumps(results["map_step_ms"]))
    if not args.skip_predictive:
        results["glm_predictive"] = predictive_times(args)
        print("GLM predictive:", json.dumps(results["glm_predictive"], indent=1))
    results["load_average_end"] = harness.load_average()
    print(harness.context_line(results["context"], results["load_average_end"]))
    harness.write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
