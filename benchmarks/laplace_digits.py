"""Benchmark: Laplace approximations of a small network on scikit-learn's digits, against the MAP.

Setting. An MLP ``64 -> 32 (tanh) -> 10`` written as a ``PyroModule`` with ``PyroSample`` weights and
biases, prior ``N(0, 1)`` on each (2,410 numbers), Categorical likelihood through a data plate
subsampled by 100 (the pattern of ``examples/bnn_digits.py``). Digits: 1,797 8x8 images scaled to
[0, 1], split once with a fixed permutation (seed 0) into 1,347 training and 450 test images. The
MAP is fitted once (``SVI(model, AutoLaplace(model), Adam(lr=1e-2), Trace_ELBO())``, ``--map-steps``
steps from a draw of the prior), and **every row below uses that same MAP** except the online
marginal-likelihood rows, which train their own network and prior together.

Rows (pyro_sgmcmc; all GLM predictive with the probit link):

* ``MAP``: the network's softmax at the MAP;
* ``diag`` / ``kron``: all weights, ``curvature="diag_ggn"`` / ``"kron"``; ``last-layer``: the output
  layer only (``subset_of_weights="last_layer"``, ``curvature="full_ggn"``, 330 weights), each
  at the model's prior (``lambda = 1``), then after post-hoc tuning of the prior precision
  (``optimize_prior_precision``: the standard evidence, scalar; and per site for kron);
* ``online marglik``: ``AutoLaplace(..., curvature="kron").marglik_training(...)`` with one
  precision per site, ``--map-steps`` steps, evidence steps every 100 steps, from the default start
  (``init_to_fan_in``; until 2026-11-27 from ``init_to_sample``, as the MAP above).

laplace-torch (``pip install laplace-torch``, optional): the same MAP weights in a
``torch.nn.Sequential``; ``Laplace(net, "classification", subset_of_weights=..., hessian_structure=...)``
for diag / kron (all weights) and full (last layer), ``la.fit``, then ``optimize_prior_precision``
(``method="marglik"``, scalar), predictions ``la(x, pred_type="glm", link_approx="probit")``; and its
``marglik_training`` on a fresh network (kron, layerwise precision, the same number of epochs as
our steps / epoch).

Columns: test accuracy, NLL (mean ``-log p(y | x)``), ECE (15 equal-width confidence bins), the log
evidence (Laplace) at the row's precision, the prior precision, fit time (curvature sweep, or
training for the online rows), tune time, and predict time (450 test images). One torch thread.

Run::

    python benchmarks/laplace_digits.py            # a few minutes on a 2-core machine
    python benchmarks/laplace_digits.py --tiny     # seconds: smoke test

Writes ``benchmarks/laplace_digits_results.json`` (``--out``).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide.initialization import init_to_sample
from pyro.nn import PyroModule, PyroSample

from pyro_sgmcmc.guides import AutoLaplace

if __package__:  # imported as benchmarks.laplace_digits
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness

NUM_BINS = 15


# ---------------------------------------------------------------------------------- data and model
def load_data(seed: int = 0, tiny: bool = False) -> dict:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    train, test = perm[:1347], perm[1347:]
    if tiny:
        train, test = train[:300], test[:100]
    return {"x": x[train], "y": y[train], "x_test": x[test], "y_test": y[test]}


class Mlp(PyroModule):
    """64 -> hidden (tanh) -> 10, N(0, 1) on every weight and bias; the network runs outside the plate."""

    def __init__(self, hidden: int, batch_size: int):
        super().__init__()
        self.batch_size = batch_size
        self.fc1 = PyroModule[torch.nn.Linear](64, hidden)
        self.fc1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([hidden, 64]).to_event(2))
        self.fc1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        self.fc2 = PyroModule[torch.nn.Linear](hidden, 10)
        self.fc2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([10, hidden]).to_event(2))
        self.fc2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([10]).to_event(1))

    def logits(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))

    def forward(self, x, y):
        plate = pyro.plate("data", len(x), subsample_size=min(self.batch_size, len(x)))
        logits = self.logits(x[plate.indices])
        with plate:
            pyro.sample("y", dist.Categorical(logits=logits), obs=y[plate.indices])


def logits_fn(net):
    return lambda params, x: pyro.poutine.condition(net.logits, data=params)(x)


# ---------------------------------------------------------------------------------- metrics
def scores(probs: torch.Tensor, y: torch.Tensor) -> dict:
    """Accuracy, NLL and the 15-bin expected calibration error of class probabilities."""
    probs = probs.detach().double()
    confidence, predicted = probs.max(-1)
    correct = (predicted == y).double()
    nll = -probs.gather(-1, y.unsqueeze(-1)).squeeze(-1).clamp(min=1e-300).log().mean()
    edges = torch.linspace(0, 1, NUM_BINS + 1, dtype=torch.float64)
    ece = torch.zeros((), dtype=torch.float64)
    for low, high in zip(edges[:-1], edges[1:]):
        inside = (confidence > low) & (confidence <= high)
        if inside.any():
            ece += inside.double().mean() * (correct[inside].mean() - confidence[inside].mean()).abs()
    return {
        "accuracy": correct.mean().item(),
        "nll": nll.item(),
        "ece": ece.item(),
        "mean_confidence": confidence.mean().item(),
    }


# ---------------------------------------------------------------------------------- ours
def fit_map(net, data, steps: int, seed: int):
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    guide = AutoLaplace(net, init_loc_fn=init_to_sample, disable_progbar=True)
    svi = SVI(net, guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
    start = time.perf_counter()
    for _ in range(steps):
        svi.step(data["x"], data["y"])
    return guide, time.perf_counter() - start


def laplace_rows(net, map_loc, data, name, curvature, subset, modes) -> list:
    """Rows at the model's prior, then after post-hoc tuning in each of ``modes``."""
    pyro.clear_param_store()
    guide = AutoLaplace(net, curvature=curvature, subset_of_weights=subset, disable_progbar=True)
    guide(data["x"], data["y"])
    guide.loc.data = map_loc.clone()
    laplace, fit_time = harness.timed(lambda: guide.laplace_approximation(data["x"], data["y"]))
    laplace.set_prior_precision(1.0)
    rows = [_our_row(f"{name}, prior", laplace, net, data, fit_time, 0.0)]
    for mode in modes:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            optimum, tune_time = harness.timed(lambda: laplace.optimize_prior_precision(mode))
        row = _our_row(f"{name}, tuned ({mode})", laplace, net, data, fit_time, tune_time)
        row["warnings"] = [str(w.message) for w in caught]
        rows.append(row)
    return rows


def _precision_summary(laplace) -> str:
    values = {name: float(value.reshape(-1)[0]) for name, value in laplace.prior_precision.items()}
    distinct = sorted(set(round(v, 6) for v in values.values()))
    if len(distinct) == 1:
        return f"{distinct[0]:.4g}"
    return ", ".join(f"{name.split('.')[0][-3:]}.{name.split('.')[-1][0]}={v:.3g}" for name, v in values.items())


def _our_row(label, laplace, net, data, fit_time, tune_time) -> dict:
    predict = lambda: laplace.predict(logits_fn(net), data["x_test"], link="probit", batch_size=64)  # noqa: E731
    probs, predict_time = harness.timed(predict)
    return {
        "method": label,
        "library": "pyro_sgmcmc",
        **scores(probs, data["y_test"]),
        "log_evidence": laplace.log_marginal_likelihood().item(),
        "prior_precision": _precision_summary(laplace),
        "fit_s": fit_time,
        "tune_s": tune_time,
        "predict_s": predict_time,
    }


def map_row(net, guide, data, fit_time) -> dict:
    with torch.no_grad():
        probs = pyro.poutine.condition(net.logits, data=guide.median())(data["x_test"]).softmax(-1)
    return {"method": "MAP", "library": "pyro_sgmcmc", **scores(probs, data["y_test"]), "log_evidence": None,
            "prior_precision": "1", "fit_s": fit_time, "tune_s": 0.0, "predict_s": 0.0}  # fmt: skip


def online_row(args, data) -> dict:
    pyro.clear_param_store()
    pyro.set_rng_seed(args.seed)
    net = Mlp(args.hidden, args.batch_size)
    guide = AutoLaplace(net, curvature="kron", disable_progbar=True)  # the default start, init_to_fan_in
    laplace, train_time = harness.timed(
        lambda: guide.marglik_training(
            data["x"], data["y"], num_steps=args.map_steps, optim=pyro.optim.Adam({"lr": 1e-2}),
            mode="site", hyper_every=args.hyper_every, hyper_steps=10, hyper_lr=0.1,
        )
    )  # fmt: skip
    row = _our_row("online marglik (kron, per site)", laplace, net, data, train_time, 0.0)
    with torch.no_grad():
        probs = pyro.poutine.condition(net.logits, data=laplace.median())(data["x_test"]).softmax(-1)
    map_scores = scores(probs, data["y_test"])
    row["its_map"] = map_scores
    return row


# ---------------------------------------------------------------------------------- laplace-torch
def sequential_from(params: dict, hidden: int) -> torch.nn.Module:
    net = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 10))
    with torch.no_grad():
        net[0].weight.copy_(params["fc1.weight"])
        net[0].bias.copy_(params["fc1.bias"])
        net[2].weight.copy_(params["fc2.weight"])
        net[2].bias.copy_(params["fc2.bias"])
    return net


def laplace_torch_rows(args, params: dict, data) -> list:
    try:
        import laplace as laplace_torch
    except ImportError:
        return []
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(data["x"], data["y"]), batch_size=args.batch_size
    )
    rows = []
    for label, subset, structure in [
        ("diag", "all", "diag"), ("kron", "all", "kron"), ("last-layer (full)", "last_layer", "full")
    ]:  # fmt: skip
        la = laplace_torch.Laplace(
            sequential_from(params, args.hidden), "classification", subset_of_weights=subset,
            hessian_structure=structure, prior_precision=1.0,
        )  # fmt: skip
        _, fit_time = harness.timed(lambda: la.fit(loader))
        rows.append(_their_row(f"{label}, prior", la, data, fit_time, 0.0))
        _, tune_time = harness.timed(lambda: la.optimize_prior_precision(method="marglik", pred_type="glm"))
        rows.append(_their_row(f"{label}, tuned (scalar)", la, data, fit_time, tune_time))
    if not args.skip_laplace_torch_marglik:
        torch.manual_seed(args.seed)
        net = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.Tanh(), torch.nn.Linear(args.hidden, 10))
        epochs = max(1, round(args.map_steps * args.batch_size / len(data["y"])))
        start = time.perf_counter()
        la, net, _, _ = laplace_torch.marglik_training(
            net, loader, likelihood="classification", hessian_structure="kron", n_epochs=epochs,
            optimizer_kwargs={"lr": 1e-2}, marglik_frequency=max(1, epochs // 30), prior_structure="layerwise",
            progress_bar=False,
        )  # fmt: skip
        rows.append(_their_row("online marglik (kron, layerwise)", la, data, time.perf_counter() - start, 0.0))
    return rows


def _their_row(label, la, data, fit_time, tune_time) -> dict:
    with torch.no_grad():
        probs, predict_time = harness.timed(lambda: la(data["x_test"], pred_type="glm", link_approx="probit"))
    precision = la.prior_precision.detach().reshape(-1)
    summary = f"{precision[0].item():.4g}" if precision.numel() == 1 else ", ".join(f"{v:.3g}" for v in precision)
    return {
        "method": label,
        "library": "laplace-torch",
        **scores(probs, data["y_test"]),
        "log_evidence": la.log_marginal_likelihood().item(),
        "prior_precision": summary,
        "fit_s": fit_time,
        "tune_s": tune_time,
        "predict_s": predict_time,
    }


# ---------------------------------------------------------------------------------- report
def markdown(rows: list) -> str:
    header = ["library", "method", "accuracy", "mean confidence", "NLL", "ECE", "log evidence", "prior precision",
              "fit s", "tune s", "predict s"]  # fmt: skip
    return harness.markdown_table(header, [
        [r["library"], r["method"], f"{r['accuracy']:.4f}", f"{r['mean_confidence']:.4f}", f"{r['nll']:.4f}",
         f"{r['ece']:.4f}", "" if r["log_evidence"] is None else f"{r['log_evidence']:.1f}", r["prior_precision"],
         f"{r['fit_s']:.2f}", f"{r['tune_s']:.2f}", f"{r['predict_s']:.2f}"]
        for r in rows
    ])  # fmt: skip


def parse_args(argv=None):
    default_out = Path(__file__).with_name("laplace_digits_results.json")
    parser = harness.parser(__doc__, default_out, "300 training images, 8 hidden units, 100 steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--map-steps", type=int, default=3000, help="Adam steps of the MAP fit (default 3000)")
    parser.add_argument("--hyper-every", type=int, default=100, help="online marglik: evidence steps every ... steps")
    parser.add_argument("--skip-laplace-torch-marglik", action="store_true")
    args = parser.parse_args(argv)
    if args.tiny:
        args.hidden, args.map_steps, args.hyper_every = 8, 100, 25
    return args


def main(argv=None) -> dict:
    """Run the benchmark; one torch thread and Pyro's validation off while it runs, restored after (a test
    calls this in the test process)."""
    args = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pyro.validation_enabled(False):
            return run(args)
    finally:
        torch.set_num_threads(threads)


def run(args) -> dict:
    context = harness.run_context()
    print(harness.context_line(context), flush=True)
    data = load_data(args.seed, args.tiny)
    net = Mlp(args.hidden, args.batch_size)
    guide, map_time = fit_map(net, data, args.map_steps, args.seed)
    map_loc = guide.loc.detach().clone()
    params = {name: value.detach().clone() for name, value in guide.median().items()}
    rows = [map_row(net, guide, data, map_time)]
    rows += laplace_rows(net, map_loc, data, "diag", "diag_ggn", "all", ["scalar"])
    rows += laplace_rows(net, map_loc, data, "kron", "kron", "all", ["scalar", "site"])
    rows += laplace_rows(net, map_loc, data, "last-layer (full)", "full_ggn", "last_layer", ["scalar"])
    rows.append(online_row(args, data))
    rows += laplace_torch_rows(args, params, data)
    table = markdown(rows)
    print(table)
    load_end = harness.load_average()
    print(harness.context_line(context, load_end))
    results = {
        "context": context,
        "load_average_end": load_end,
        "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                   "torch": torch.__version__, "num_train": len(data["y"]), "num_test": len(data["y_test"])},
        "rows": rows,
        "table": table,
    }  # fmt: skip
    results["config"]["out"] = args.out.name
    harness.write_json(args.out, results, default=float)
    return results


if __name__ == "__main__":
    main()
