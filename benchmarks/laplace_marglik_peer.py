"""Benchmark: online marginal-likelihood training against laplace-torch's ``marglik_training``.

Setting. scikit-learn's breast-cancer data (569 tumours, 30 features standardised on the training
split), split once with a fixed permutation (seed 0) into 448 training and 121 test examples. An
MLP ``30 -> 50 (tanh) -> 50 (tanh) -> 2`` (4,202 weights), Categorical likelihood, minibatches of
64 (7 per epoch). Both libraries run laplace-torch's ``marglik_training`` defaults: Adam with
learning rate 1e-3 on the weights, 300 epochs, a Kronecker-factored GGN Laplace (``"kron"``) fitted
after every epoch (``marglik_frequency=1``, no burn-in) and followed by 10 Adam steps (learning
rate 0.1) on the log prior precision, one precision per weight matrix and per bias vector
(``prior_structure="layerwise"``, our ``mode="site"``), starting at 1.

Rows, for each seed (the seed draws the start and the minibatches):

* ``laplace-torch``: ``marglik_training(net, loader, "classification", "kron")`` on a
  ``torch.nn.Sequential`` started by torch's default initialisation (``torch.manual_seed(seed)``);
  it returns the network and precision of the epoch with the best evidence.
* ``ours, same start``: ``AutoLaplace(model, curvature="kron", map_values=...)`` started at the
  same weights (``init_loc_fn`` there), ``marglik_training(num_steps=7 * epochs, hyper_every=7,
  optim=Adam({"lr": 1e-3}))``, with ``keep_best=True`` (the default, as laplace-torch) and ``False``;
* ``ours, init_to_fan_in``: the default start of ``AutoLaplace`` (``torch.nn.Linear``'s scale);
* ``ours, init_to_sample``: a draw of the ``N(0, 1)`` prior, the start the docs used to show.

Columns: the final log evidence (each evaluated by our ``log_marginal_likelihood``; laplace-torch's
end point is also evaluated by its own, the ``check`` column, which must agree), test accuracy and
NLL of the returned MAP network, wall seconds of the whole training run. One torch thread; the
libraries alternate within each seed so that the machine's load hits both alike.

Run::

    python benchmarks/laplace_marglik_peer.py            # about 10 minutes on a loaded 2-core machine
    python benchmarks/laplace_marglik_peer.py --tiny     # seconds: smoke test (laplace-torch skipped if absent)

Writes ``benchmarks/laplace_marglik_peer_results.json`` (``--out``).
"""

from __future__ import annotations

import copy
import statistics
import time
import warnings
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide.initialization import init_to_sample, init_to_value
from pyro.nn import PyroModule, PyroSample

from pyro_sgmcmc.guides import AutoLaplace, init_to_fan_in

if __package__:  # imported as benchmarks.laplace_marglik_peer
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness

NUM_TRAIN = 448


def load_data(tiny: bool = False) -> dict:
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    train, test = perm[:NUM_TRAIN], perm[NUM_TRAIN:]
    if tiny:
        train, test = train[:128], test[:64]
    mean, sd = x[train].mean(0), x[train].std(0)
    x = (x - mean) / sd
    return {"x": x[train], "y": y[train], "x_test": x[test], "y_test": y[test]}


class Mlp(PyroModule):
    """``sizes[0] -> ... -> sizes[-1]``, tanh between layers, ``N(0, 1)`` on every weight and bias."""

    def __init__(self, sizes, batch_size: int):
        super().__init__()
        self.batch_size = batch_size
        self.layers = PyroModule[torch.nn.ModuleList](
            [PyroModule[torch.nn.Linear](a, b) for a, b in zip(sizes[:-1], sizes[1:])]
        )
        for layer, (a, b) in zip(self.layers, zip(sizes[:-1], sizes[1:])):
            layer.weight = PyroSample(dist.Normal(0.0, 1.0).expand([b, a]).to_event(2))
            layer.bias = PyroSample(dist.Normal(0.0, 1.0).expand([b]).to_event(1))

    def logits(self, x):
        for number, layer in enumerate(self.layers):
            x = layer(x)
            if number < len(self.layers) - 1:
                x = torch.tanh(x)
        return x

    def forward(self, x, y):
        plate = pyro.plate("data", len(x), subsample_size=min(self.batch_size, len(x)))
        logits = self.logits(x[plate.indices])
        with plate:
            pyro.sample("y", dist.Categorical(logits=logits), obs=y[plate.indices])


def sequential(sizes) -> torch.nn.Sequential:
    modules = []
    for number, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        modules.append(torch.nn.Linear(a, b))
        if number < len(sizes) - 2:
            modules.append(torch.nn.Tanh())
    return torch.nn.Sequential(*modules)


def site_values(net: torch.nn.Sequential) -> dict:
    """The Sequential's weights under our model's site names (``layers.k.weight``)."""
    linears = [module for module in net if isinstance(module, torch.nn.Linear)]
    values = {}
    for number, layer in enumerate(linears):
        values[f"layers.{number}.weight"] = layer.weight.detach().clone()
        values[f"layers.{number}.bias"] = layer.bias.detach().clone()
    return values


def test_scores(logits: torch.Tensor, y: torch.Tensor) -> dict:
    log_probs = logits.detach().double().log_softmax(-1)
    return {
        "accuracy": (log_probs.argmax(-1) == y).double().mean().item(),
        "nll": -log_probs.gather(-1, y.unsqueeze(-1)).mean().item(),
    }


# ---------------------------------------------------------------------------------- the two libraries
def ours(args, data, seed: int, start: dict, init: str, keep_best: bool) -> dict:
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = Mlp(args.sizes, args.batch_size)
    strategy = {"same start": init_to_value(values=start), "init_to_fan_in": init_to_fan_in,
                "init_to_sample": init_to_sample}[init]  # fmt: skip
    guide = AutoLaplace(net, curvature="kron", init_loc_fn=strategy, disable_progbar=True)
    steps_per_epoch = len(data["y"]) // args.batch_size
    begin = time.perf_counter()
    laplace = guide.marglik_training(
        data["x"], data["y"], num_steps=args.epochs * steps_per_epoch, optim=pyro.optim.Adam({"lr": args.lr}),
        mode="site", hyper_every=steps_per_epoch, hyper_steps=10, hyper_lr=0.1, keep_best=keep_best,
    )  # fmt: skip
    seconds = time.perf_counter() - begin
    with torch.no_grad():
        logits = pyro.poutine.condition(net.logits, data=laplace.median())(data["x_test"])
    return {
        "library": "pyro_sgmcmc",
        "start": init,
        "keep_best": keep_best,
        "seed": seed,
        "log_evidence": laplace.log_marginal_likelihood().item(),
        "prior_precision": [float(v) for v in laplace.prior_precision.values()],
        "seconds": seconds,
        **test_scores(logits, data["y_test"]),
    }


def theirs(laplace_torch, args, data, seed: int) -> dict:
    torch.manual_seed(seed)
    net = sequential(args.sizes)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(data["x"], data["y"]), batch_size=args.batch_size, shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    begin = time.perf_counter()
    la, net, _, _ = laplace_torch.marglik_training(
        net, loader, likelihood="classification", hessian_structure="kron", n_epochs=args.epochs,
        prior_structure="layerwise",
    )  # fmt: skip
    seconds = time.perf_counter() - begin
    precision = la.prior_precision.detach().reshape(-1)
    # their end point, evaluated by our evidence: the MAP as map_values, their precisions per site
    values = site_values(net)
    check = AutoLaplace(
        Mlp(args.sizes, args.batch_size), curvature="kron", map_values=values, disable_progbar=True,
        prior_precision={name: float(v) for name, v in zip(values, precision)},
    ).laplace_approximation(data["x"], data["y"])  # fmt: skip
    with torch.no_grad():
        logits = net(data["x_test"])
    return {
        "library": "laplace-torch",
        "start": "torch default",
        "keep_best": True,
        "seed": seed,
        "log_evidence": check.log_marginal_likelihood().item(),
        "log_evidence_theirs": la.log_marginal_likelihood().item(),
        "prior_precision": precision.tolist(),
        "seconds": seconds,
        **test_scores(logits, data["y_test"]),
    }


# ---------------------------------------------------------------------------------- report
VARIANTS = [("same start", True), ("same start", False), ("init_to_fan_in", True), ("init_to_sample", True)]


def summary(rows: list) -> list:
    """Per variant: the evidence and time of each seed, and the median difference to laplace-torch's."""
    reference = {row["seed"]: row for row in rows if row["library"] == "laplace-torch"}
    table = []
    for label, match in [("laplace-torch", lambda r: r["library"] == "laplace-torch")] + [
        (f"ours, {init}{'' if keep else ', keep_best=False'}",
         lambda r, init=init, keep=keep: r["library"] == "pyro_sgmcmc" and (r["start"], r["keep_best"]) == (init, keep))
        for init, keep in VARIANTS
    ]:  # fmt: skip
        chosen = sorted((r for r in rows if match(r)), key=lambda r: r["seed"])
        if not chosen:
            continue
        entry = {
            "variant": label,
            "log_evidence": [round(r["log_evidence"], 2) for r in chosen],
            "seconds": [round(r["seconds"], 2) for r in chosen],
            "test_accuracy": [round(r["accuracy"], 4) for r in chosen],
            "test_nll": [round(r["nll"], 4) for r in chosen],
        }
        if reference and all(r["seed"] in reference for r in chosen):
            entry["median_evidence_minus_theirs"] = statistics.median(
                r["log_evidence"] - reference[r["seed"]]["log_evidence"] for r in chosen
            )
            entry["median_time_ratio_to_theirs"] = statistics.median(
                r["seconds"] / reference[r["seed"]]["seconds"] for r in chosen
            )
        table.append(entry)
    return table


def parse_args(argv=None):
    default_out = Path(__file__).with_name("laplace_marglik_peer_results.json")
    parser = harness.parser(__doc__, default_out, "128 training examples, 8 hidden units, 3 epochs, one seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate for the weights")
    args = parser.parse_args(argv)
    if args.tiny:
        args.seeds, args.epochs, args.hidden = args.seeds[:1], 3, 8
    args.sizes = [30, args.hidden, args.hidden, 2]
    return args


def main(argv=None) -> dict:
    """Run the benchmark; one torch thread and Pyro's validation off while it runs, restored after."""
    args = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pyro.validation_enabled(False), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # laplace-torch's backward-hook warnings, once per epoch
            return run(args)
    finally:
        torch.set_num_threads(threads)


def run(args) -> dict:
    try:
        import laplace as laplace_torch
    except ImportError:
        laplace_torch = None
    data = load_data(args.tiny)
    warm = copy.copy(args)
    warm.epochs = 1  # one epoch of each first: imports and first-call costs stay out of the timings
    ours(warm, data, 0, site_values(sequential(args.sizes)), "same start", True)
    if laplace_torch is not None:
        theirs(laplace_torch, warm, data, 0)
    rows = []
    for number, seed in enumerate(args.seeds):
        torch.manual_seed(seed)
        start = site_values(sequential(args.sizes))
        runs = [lambda init=init, keep=keep: ours(args, data, seed, start, init, keep) for init, keep in VARIANTS]
        if laplace_torch is not None:
            runs.insert(number % 2 * len(runs), lambda: theirs(laplace_torch, args, data, seed))  # alternate order
        for one in runs:
            rows.append(one())
            print({k: rows[-1][k] for k in ("library", "start", "keep_best", "seed", "log_evidence", "seconds")},
                  flush=True)  # fmt: skip
    table = summary(rows)
    for entry in table:
        print(entry)
    results = {
        "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                   "laplace_torch": getattr(laplace_torch, "__version__", None) if laplace_torch else None,
                   "num_train": len(data["y"]), "num_test": len(data["y_test"])},
        **harness.run_context(),  # date, machine, threads and the load at the start
        "load_average_end": harness.load_average(),
        "summary": table,
        "rows": rows,
    }  # fmt: skip
    results["config"]["out"] = args.out.name
    harness.write_json(args.out, results, default=float)
    return results


if __name__ == "__main__":
    main()
