"""How the diagonal Laplace approximation scales: time and memory against one epoch of SGD.

Setting: an MLP ``100 -> 300 (tanh) -> 300 (tanh) -> K`` with ``N(0, 1)`` weights and biases as
``PyroSample`` sites (``K = 10`` classes: 123,610 weights; ``K = 1`` regression output: 120,901),
``N = 10,000`` synthetic examples, minibatches of ``B = 100`` through a subsampled plate (the
pattern of ``examples/bnn_digits.py``: the network runs outside the plate).

For each task the script times, with ``--threads`` torch threads (1 by default, a fair single-core
comparison on a shared machine):

* ``sgd_epoch_svi``: one epoch (``N / B = 100`` steps) of ``SVI(model, AutoLaplace(model),
  pyro.optim.SGD, Trace_ELBO())``, the MAP fit the Laplace approximation starts from;
* ``sgd_epoch_torch``: one epoch of a hand-written ``torch.nn`` + ``torch.optim.SGD`` loop on the
  same network and loss (prior as weight decay), the floor for an epoch;
* ``laplace_<curvature>``: ``guide.laplace_approximation(x, y)``, the full-data curvature sweep, for
  ``diag_ef``, ``diag_ggn`` (exact: one backward pass per output per example) and ``diag_ggn`` with
  ``mc_fisher=True`` (one Monte Carlo label per example), and the same two for ``kron`` (K-FAC);
* ``pyro_autolaplace``: Pyro's :class:`~pyro.infer.autoguide.AutoLaplaceApproximation`, which
  builds the dense Hessian of the full-data loss by ``d`` backward passes (``pyro.ops.hessian``):
  the script times the gradient with ``create_graph=True`` plus ``--hessian-rows`` rows and
  extrapolates to ``d`` rows; its memory is the ``d x d`` float32 matrix (never allocated here).

The timings of one task are taken in one fresh process, interleaved (each of ``--repeats`` rounds
runs every measurement once, after one warm-up run of each), so that the load of a shared machine
hits all of them alike; the ratios are ratios of medians (all times and the minima are in the
JSON). The peak memory of each Laplace sweep is measured in its own fresh process (``ru_maxrss``
after minus before the sweep) and compared with ``d`` floats.

Reproduce::

    python benchmarks/laplace_scale.py --out benchmarks/laplace_scale_results.json
    python benchmarks/laplace_scale.py --quick          # N = 2,000, 1 repeat: a smoke run
"""

from __future__ import annotations

import json
import multiprocessing as mp
import resource
import statistics
import time
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoLaplaceApproximation
from pyro.infer.autoguide.initialization import init_to_sample
from pyro.nn import PyroModule, PyroSample

from pyro_sgmcmc.guides import AutoLaplace

if __package__:  # imported as benchmarks.laplace_scale
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness

D_IN, HIDDEN = 100, 300


class MLP(PyroModule):
    def __init__(self, out: int):
        super().__init__()
        sizes = [(D_IN, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, out)]
        self.layers = PyroModule[torch.nn.ModuleList]([PyroModule[torch.nn.Linear](i, o) for i, o in sizes])
        for layer, (i, o) in zip(self.layers, sizes):
            layer.weight = PyroSample(dist.Normal(0.0, 1.0).expand([o, i]).to_event(2))
            layer.bias = PyroSample(dist.Normal(0.0, 1.0).expand([o]).to_event(1))

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))
        return self.layers[-1](x)


def make_problem(task: str, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D_IN, generator=g)
    teacher = torch.randn(D_IN, 10, generator=g) / D_IN**0.5
    if task == "classification":
        y = torch.distributions.Categorical(logits=3 * x @ teacher).sample()
        out = 10
    else:
        y = torch.sin(x @ teacher[:, 0] * 2) + 0.1 * torch.randn(n, generator=g)
        out = 1
    return x, y, out


def make_model(net: MLP, task: str, batch: int):
    def model(x, y):
        plate = pyro.plate("data", len(y), subsample_size=batch)
        f = net(x[plate.indices])
        with plate:
            if task == "classification":
                pyro.sample("y", dist.Categorical(logits=f), obs=y[plate.indices])
            else:
                pyro.sample("y", dist.Normal(f.squeeze(-1), 0.1), obs=y[plate.indices])

    return model


def fitted_guide(task, n, batch, curvature="diag_ggn", mc_fisher=False, seed=0):
    """A guide set up (one SVI step, random init) on the benchmark problem; returns (guide, model, x, y, d)."""
    x, y, out = make_problem(task, n, seed)
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = MLP(out)
    model = make_model(net, task, batch)
    guide = AutoLaplace(model, curvature=curvature, monte_carlo_fisher=mc_fisher, init_loc_fn=init_to_sample,
                        disable_progbar=True)  # fmt: skip
    guide(x, y)
    with torch.no_grad():
        guide.loc.mul_(0.1)  # a small random point, like a network initialisation
    return guide, model, x, y, guide.latent_dim


def _torch_epoch_timer(task, n, batch):
    """A closure that times one epoch of the hand-written torch loop (network and data built once)."""
    x, y, out = make_problem(task, n)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(D_IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN),
                              torch.nn.Tanh(), torch.nn.Linear(HIDDEN, out))  # fmt: skip
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3, weight_decay=1.0 / n)
    loss_fn = torch.nn.CrossEntropyLoss() if task == "classification" else torch.nn.MSELoss()

    def epoch() -> float:
        order = torch.randperm(n)
        start = time.perf_counter()
        for step in range(n // batch):
            idx = order[step * batch : (step + 1) * batch]
            optimizer.zero_grad()
            f = net(x[idx])
            loss = loss_fn(f, y[idx]) if task == "classification" else loss_fn(f.squeeze(-1), y[idx])
            loss.backward()
            optimizer.step()
        return time.perf_counter() - start

    return epoch


def time_interleaved(task, n, batch, variants, repeats) -> dict:
    """All timings of one task in one process, interleaved: each repeat runs every measurement once.

    Every measurement is warmed up once first; the load of a shared machine then hits all of them
    alike, and the medians are compared.
    """
    timers = {"sgd_epoch_torch": _torch_epoch_timer(task, n, batch)}
    for curvature, mc in variants:
        laplace_guide, _, lx, ly, _ = fitted_guide(task, n, batch, curvature, mc)

        def sweep(g=laplace_guide, gx=lx, gy=ly) -> float:
            start = time.perf_counter()
            g.laplace_approximation(gx, gy)
            return time.perf_counter() - start

        timers[f"laplace_{curvature}{'_mc' if mc else ''}"] = sweep
    # the SVI guide last: fitted_guide clears the param store, which SVI uses from here on
    guide, model, x, y, _ = fitted_guide(task, n, batch)
    svi = SVI(model, guide, pyro.optim.SGD({"lr": 1e-9}), Trace_ELBO())

    def svi_epoch() -> float:
        start = time.perf_counter()
        for _ in range(n // batch):
            svi.step(x, y)
        return time.perf_counter() - start

    timers["sgd_epoch_svi"] = svi_epoch
    for timer in timers.values():
        timer()  # warm-up
    times = {key: [] for key in timers}
    for _ in range(repeats):
        for key, timer in timers.items():
            times[key].append(timer())
    return times


def time_laplace(task, n, batch, curvature, mc_fisher) -> dict:
    guide, _, x, y, d = fitted_guide(task, n, batch, curvature, mc_fisher)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    laplace = guide.laplace_approximation(x, y)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert bool((laplace.precision > 0).all())
    return {"seconds": seconds, "peak_rss_increase_mb": (after - before) / 1024, "d": d}


def time_pyro_autolaplace(task, n, batch, rows: int) -> dict:
    """Pyro's dense Hessian on the full data (no subsampling: its loss is one trace of the model)."""
    x, y, out = make_problem(task, n)
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    net = MLP(out)
    model = make_model(net, task, n)  # subsample_size = N: the full-data loss Pyro differentiates
    guide = AutoLaplaceApproximation(model, init_loc_fn=init_to_sample)
    guide(x, y)
    d = guide.latent_dim
    guide_trace = pyro.poutine.trace(guide).get_trace(x, y)
    start = time.perf_counter()
    model_trace = pyro.poutine.trace(pyro.poutine.replay(model, trace=guide_trace)).get_trace(x, y)
    loss = guide_trace.log_prob_sum() - model_trace.log_prob_sum()
    (grad,) = torch.autograd.grad(loss, guide.loc, create_graph=True)
    setup = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(rows):  # exactly pyro.ops.hessian's loop, for the first rows
        torch.autograd.grad(grad[i], guide.loc, retain_graph=True)
    per_row = (time.perf_counter() - start) / rows
    return {"seconds_setup": setup, "seconds_per_row": per_row, "rows_timed": rows,
            "extrapolated_seconds": setup + d * per_row, "dense_hessian_gb_float32": d * d * 4 / 1e9,
            "d": d}  # fmt: skip


def _worker(queue, threads, name, args):
    torch.set_num_threads(threads)
    queue.put(globals()[name](*args))


def in_fresh_process(threads, name, *args):
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_worker, args=(queue, threads, name, args))
    process.start()
    result = queue.get()
    process.join()
    return result


def main(argv=None) -> dict:
    parser = harness.parser(__doc__, Path("laplace_scale_results.json"), tiny=None)
    parser.add_argument("--quick", action="store_true", help="N = 2,000, one repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hessian-rows", type=int, default=20)
    parser.add_argument("--tasks", nargs="+", default=["regression", "classification"])
    args = parser.parse_args(argv)
    n, batch = (2000, 100) if args.quick else (10_000, 100)
    repeats = 1 if args.quick else args.repeats
    variants = [("diag_ef", False), ("diag_ggn", False), ("diag_ggn", True), ("kron", False), ("kron", True)]
    results = {"config": {"N": n, "B": batch, "threads": args.threads, "repeats": repeats,
                          "network": f"{D_IN}-{HIDDEN}-{HIDDEN}-K tanh MLP"},
               "context": harness.run_context(sweep_torch_threads=args.threads),
               "tasks": {}}  # fmt: skip
    print(harness.context_line(results["context"], threads=args.threads), flush=True)  # each sweep's threads
    for task in args.tasks:
        memory = {}
        d = None
        for curvature, mc in variants:  # peak memory: one fresh process per sweep
            key = f"laplace_{curvature}{'_mc' if mc else ''}"
            run = in_fresh_process(args.threads, "time_laplace", task, n, batch, curvature, mc)
            memory[key] = run["peak_rss_increase_mb"]
            d = run["d"]
        times = in_fresh_process(args.threads, "time_interleaved", task, n, batch, variants, repeats)
        print(task, {k: [round(t, 2) for t in v] for k, v in times.items()}, flush=True)
        best = {k: min(v) for k, v in times.items()}
        median = {k: statistics.median(v) for k, v in times.items()}
        pyro_cost = in_fresh_process(args.threads, "time_pyro_autolaplace", task, n, batch, args.hessian_rows)
        laplace_keys = [k for k in median if k.startswith("laplace")]
        results["tasks"][task] = {
            "d": d,
            "seconds": times,
            "min_seconds": best,
            "median_seconds": median,
            "laplace_over_svi_epoch": {k: median[k] / median["sgd_epoch_svi"] for k in laplace_keys},
            "laplace_over_torch_epoch": {k: median[k] / median["sgd_epoch_torch"] for k in laplace_keys},
            "peak_rss_increase_mb": memory,
            "d_float32_mb": d * 4 / 2**20,
            "pyro_autolaplace": pyro_cost,
        }
        print(json.dumps(results["tasks"][task], indent=1), flush=True)
    results["load_average_end"] = harness.load_average()
    print(harness.context_line(results["context"], results["load_average_end"], threads=args.threads))
    harness.write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
