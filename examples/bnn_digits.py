"""A Bayesian neural network on scikit-learn's 8x8 digits, sampled with SGHMC in ``pyro.infer.MCMC``.

The network is a one-hidden-layer MLP (64 -> 32 tanh -> 10) written as a :class:`pyro.nn.PyroModule`
whose weights and biases are :class:`pyro.nn.PyroSample` sites with a Gaussian prior. The
likelihood reads the 1,347 training images through a subsampled data plate, so every SGHMC step
sees a fresh minibatch. The script compares, on the 450 held-out images:

* the MAP estimate from the same kernel at ``temperature=0`` (SGHMC at T = 0 is SGD with
  momentum; the prior acts as weight decay),
* the SGHMC posterior predictive at ``temperature=1`` (the Bayesian posterior): the softmax
  probabilities averaged over thinned draws, and
* the same at ``temperature=0.1``, a cold posterior (``--temperatures`` sets the list),

by test accuracy and test negative log-likelihood (NLL: mean over images of ``-log p(y | x)``).

Run it::

    python examples/bnn_digits.py            # about 1 min wall, 37 s of CPU, on a shared 2-core machine
    python examples/bnn_digits.py --tiny     # a few seconds, smoke test only

The pattern that keeps the weights global
------------------------------------------
A ``PyroModule`` samples its ``PyroSample`` weights *when it is called*. Every ``pyro.sample``
statement executed inside ``with pyro.plate("data", ...)`` belongs to that plate, so calling the
network inside the plate makes each weight a sample site of the data plate: Pyro gives it the
plate's batch dimension (one weight matrix per image of the minibatch, shape ``(B, 32, 64)``
instead of ``(32, 64)``) and scales its prior by ``N / B``. ``torch.nn.Linear`` cannot apply a batch
of weight matrices, so that model fails at its first run (a network that happened to broadcast
would run, but it would be a different model with weights local to each image, which the SG-MCMC
kernels refuse). The model below therefore

1. creates the plate object first: ``plate = pyro.plate("data", N, subsample_size=B)``. The
   minibatch is drawn when the plate object is *constructed*, not when it is entered (under the
   SG-MCMC kernels the kernel supplies each step's minibatch by conditioning the plate's
   subsample site, and the plate object holds those indices just the same);
2. reads this minibatch's indices from it: ``idx = plate.indices``;
3. runs the network on ``x[idx]`` *outside* the ``with plate:`` block, so the weights are sampled
   with no plate around them (global, unscaled prior);
4. enters ``with plate:`` only for the likelihood,
   ``pyro.sample("y", dist.Categorical(logits=logits), obs=y[idx])``, which is scaled by ``N / B``.

The plate object must be created inside the model so that every call, i.e. every step, draws a new
minibatch. :func:`check_plate_pattern` verifies both claims at start-up (weights without a batch
dimension and outside every plate in the pattern above; weights with the batch dimension and a
failing forward pass in the naive pattern) and the result is printed and stored in the JSON.

Settings
--------
Prior ``N(0, 1)`` on every weight and bias (2,410 numbers); minibatch ``B=100``; initial weights
drawn from the prior (``init_to_sample``). The MAP run is SGHMC at ``temperature=0`` with
``step_size=0.2``, ``friction=1.0`` (SGD with momentum: ``torch.optim.SGD(lr=0.2, momentum=0.8,
dampening=0.8)``; nothing is adapted at T = 0), 10,000 steps (about 740 epochs), keeping its last
point. Each posterior run is ``SGHMC(model, temperature=T, init_strategy=init_to_sample)`` on the
package's defaults: 5,000 warmup steps (the approach to the typical set, then the step size and a
diagonal metric adapted per chain; see ``docs/preconditioning.rst``) and 25,000 more, of which every
100th is kept (250 networks). ``--step-size 0.2`` instead runs the posteriors at that fixed step,
nothing adapted, as this script did before the adaptive warmup existed.

Memory: ``pyro.infer.MCMC`` stores every draw of every weight (here 25,000 x 2,410 numbers per
run). The runs therefore pass ``save_params=[]`` (MCMC stores nothing) and a ``hook_fn``
(:class:`KeepEvery`) that keeps every 100th draw: thinning by hand with Pyro's own MCMC.
(``pyro_sgmcmc.MCMC(..., thinning=100)`` does the same in one argument.)

Results
-------
The default run (``--seed 0``), re-measured on 2026-11-26 after the minibatch stream became keyed
pseudo-random permutations (the stream depends only on seed, chain and plate) and the automatic
control variate's decision changed, prints::

    test set (450 images)                       accuracy     NLL
      MAP / SGD (T=0)                                 0.9800   0.0911
      posterior predictive, T=1 (250 draws)           0.9756   0.1364
        single draw, T=1 (average)                    0.9328   0.2179
      posterior predictive, T=0.1 (250 draws)         0.9444   0.1910
        single draw, T=0.1 (average)                  0.9448   0.2000

and, before the table, a ``SlowMixingWarning`` for each posterior run, each saying that the
automatic control variate was measured and did not lower the noise. The adapted step sizes are
small: at most 8.95e-4 at T = 1 (a chain then needs about 2,230 steps to forget its state, 0.6 of
the 3,750 adaptation steps; the 25,000 kept steps are about 11 of those times) and at most 1.66e-5
at T = 0.1, where a chain needs about 121,000 steps to forget its state, four times the whole run.
With ``B = 100`` of 1,347 images the minibatch gradient noise is large and the warmup caps the step
where that noise would inflate the sampled variance by more than 10 %. No divergence, warmup
included. (Before the stream change the same run adapted 4.8e-4 at T = 1 and 3.5e-4 at T = 0.1,
one warmup divergence at T = 1, and printed 0.9600 / 0.1285 at T = 1 and 0.9733 / 0.0972 at
T = 0.1.)

The T = 0.1 run is the one to distrust: its step is 54 times smaller than at T = 1 and 21 times
smaller than the same run adapted before the stream change, and its 250 draws predict almost as
one network (predictive and single-draw scores agree to 0.001 in accuracy), so the chain has barely
moved in 25,000 steps from where the warmup left it. Its scores say where that point is, not what
the cold posterior predicts. It is recorded here as measured, not tuned away; the warning is the
package telling you exactly this.

With the fixed step (``--step-size 0.2``, nothing adapted) the same seed gave T = 1: 0.9778 / 0.1211
(single draws 0.9357 / 0.2294) and T = 0.1: 0.9756 / 0.0949 (single draws 0.9688 / 0.1081), the MAP
0.9800 / 0.0911 (before the stream change: T = 1 0.9756 / 0.1283, T = 0.1 0.9822 / 0.0857). That
step is about 220 and 12,000 times the adapted ones, far past the step at which the warmup's noise
estimate says the minibatch noise starts to widen the sampled distribution, so those draws come from
a noisier distribution than the (tempered) posterior. Which of the two predictive tables scores
better on test data is a property of this model and prior, not evidence for either setting.

At ``T = 1`` the posterior predictive is no better than the MAP network in accuracy and worse in
NLL, with either setting. With the fixed step the cold posterior (``T = 0.1``) is closer to the MAP,
the "cold posterior effect" (Wenzel et al., 2020, "How good is the Bayes posterior in deep neural
networks really?"); on the package's defaults it no longer is (before the stream change it was),
for the reason above. Before the stream change, ``B=400`` instead of 100 at the fixed step 0.2 left
the T = 1 predictive essentially unchanged (accuracy 0.980, NLL 0.123), so the effect did not come
from the gradient noise alone; that run was not repeated. The N(0, 1) prior is a choice, not a
recommendation; a prior scaled to the layer width (``--prior-scale``) is a natural next try.

Cost (measured 2026-11-26, one torch thread): 70,000 steps in all, 0.50 ms of CPU per step for the
MAP run and 0.52-0.54 ms for the posterior runs (warmup included); 37 s of CPU, 64 s wall on the
2-core machine shared with other jobs (load average about 3.3). (Before the automatic control
variate's search was staged, its L-BFGS search for the network's MAP cost about 29 s per posterior
run before being rejected.)

Results are written as JSON to ``--out`` (default ``bnn_digits_results.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.infer import MCMC
from pyro.infer.autoguide.initialization import init_to_sample
from pyro.nn import PyroModule, PyroSample
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import pyro_sgmcmc


# ------------------------------------------------------------------------------------ data
def load_data(seed: int = 0):
    """Digits scaled to [0, 1]; a stratified 75/25 train/test split."""
    digits = load_digits()
    x = digits.data.astype("float32") / 16.0
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=seed, stratify=digits.target
    )
    return (
        torch.tensor(x_train),
        torch.tensor(y_train, dtype=torch.long),
        torch.tensor(x_test),
        torch.tensor(y_test, dtype=torch.long),
    )


# ------------------------------------------------------------------------------------ model
class BayesianMLP(PyroModule):
    """``num_in -> num_hidden (tanh) -> num_classes`` with ``Normal(0, prior_scale)`` weights and biases."""

    def __init__(self, num_in: int, num_hidden: int, num_classes: int, prior_scale: float = 1.0):
        super().__init__()
        self.hidden = PyroModule[torch.nn.Linear](num_in, num_hidden)
        self.hidden.weight = PyroSample(dist.Normal(0.0, prior_scale).expand([num_hidden, num_in]).to_event(2))
        self.hidden.bias = PyroSample(dist.Normal(0.0, prior_scale).expand([num_hidden]).to_event(1))
        self.out = PyroModule[torch.nn.Linear](num_hidden, num_classes)
        self.out.weight = PyroSample(dist.Normal(0.0, prior_scale).expand([num_classes, num_hidden]).to_event(2))
        self.out.bias = PyroSample(dist.Normal(0.0, prior_scale).expand([num_classes]).to_event(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(x)))  # logits


def make_model(net: BayesianMLP, batch_size: int):
    """The model with THE PATTERN: network outside the plate, only the likelihood inside."""

    def model(x, y):
        # (1) Create the plate object. Constructing it draws this call's minibatch (Pyro's
        #     subsample site is sampled in the plate's constructor, not on `with`).
        plate = pyro.plate("data", len(y), subsample_size=batch_size)
        # (2) The indices of that minibatch.
        idx = plate.indices
        # (3) Run the network OUTSIDE the plate: the PyroSample weights are sampled here, with no
        #     plate around them, so they are global sites of their declared shape and their prior
        #     is counted once, unscaled.
        logits = net(x[idx])
        # (4) Only the likelihood goes inside the plate; Pyro scales it by N / B.
        with plate:
            pyro.sample("y", dist.Categorical(logits=logits), obs=y[idx])

    return model


def make_naive_model(net: BayesianMLP, batch_size: int):
    """The naive pattern, for the check only: the network is called inside the plate."""

    def naive_model(x, y):
        with pyro.plate("data", len(y), subsample_size=batch_size) as idx:
            logits = net(x[idx])  # the weights become sample sites of the data plate
            pyro.sample("y", dist.Categorical(logits=logits), obs=y[idx])

    return naive_model


def check_plate_pattern(net: BayesianMLP, x, y, batch_size: int) -> dict:
    """Trace both patterns once and report the shapes and plates of the weight sites.

    Asserts that the pattern gives every weight its parameter shape and no plate, and that the
    naive pattern gives the first weight the minibatch as a leading dimension.
    """
    weight_names = ["hidden.weight", "hidden.bias", "out.weight", "out.bias"]
    with poutine.block():
        trace = poutine.trace(make_model(net, batch_size)).get_trace(x, y)
    pattern = {
        name: {
            "shape": list(trace.nodes[name]["value"].shape),
            "plates": [frame.name for frame in trace.nodes[name]["cond_indep_stack"]],
        }
        for name in weight_names
    }
    for name, info in pattern.items():
        assert not info["plates"], f"{name} is inside {info['plates']}"
    assert pattern["hidden.weight"]["shape"] == [net.hidden.out_features, net.hidden.in_features], pattern
    assert pattern["out.bias"]["shape"] == [net.out.out_features], pattern

    # The naive pattern: the trace messenger keeps the sites recorded before the forward pass fails.
    tracer = poutine.trace(make_naive_model(net, batch_size))
    error = None
    with poutine.block():
        try:
            tracer(x, y)
        except RuntimeError as exc:  # torch.nn.Linear cannot apply a (B, out, in) batch of weights
            error = str(exc).splitlines()[0]
    site = tracer.trace.nodes["hidden.weight"]
    naive = {
        "hidden.weight shape": list(site["value"].shape),
        "plates": [frame.name for frame in site["cond_indep_stack"]],
        "prior scale": float(site["scale"]),
        "forward error": error,
    }
    assert naive["hidden.weight shape"][0] == batch_size and naive["plates"] == ["data"], naive
    return {"pattern": pattern, "naive": naive}


# ------------------------------------------------------------------------------------ prediction
@torch.no_grad()
def predictive_probs(net: BayesianMLP, draws: dict, x: torch.Tensor) -> torch.Tensor:
    """``(num_draws, len(x), num_classes)`` class probabilities, one network per draw."""
    num_draws = next(iter(draws.values())).shape[0]
    probs = []
    for i in range(num_draws):
        weights = {name: value[i] for name, value in draws.items()}
        probs.append(poutine.condition(net, data=weights)(x).softmax(-1))
    return torch.stack(probs)


def scores(probs: torch.Tensor, y: torch.Tensor) -> dict:
    """Accuracy and mean negative log-likelihood of the probabilities ``(len(y), num_classes)``."""
    p_true = probs[torch.arange(len(y)), y].clamp_min(1e-12)
    return {"accuracy": float((probs.argmax(-1) == y).float().mean()), "nll": float(-p_true.log().mean())}


# ------------------------------------------------------------------------------------ main
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=32, help="hidden units (default 32)")
    parser.add_argument("--prior-scale", type=float, default=1.0, help="prior sd of every weight (default 1)")
    parser.add_argument("--batch-size", type=int, default=100, help="minibatch size B (default 100)")
    parser.add_argument(
        "--step-size",
        type=float,
        default=None,
        help="fix the SGHMC step size of the posterior runs (default: adapted in warmup, the package's default)",
    )
    parser.add_argument("--friction", type=float, default=1.0, help="SGHMC friction (default 1.0)")
    parser.add_argument(
        "--temperatures",
        type=float,
        nargs="+",
        default=[1.0, 0.1],
        help="temperatures of the posterior runs (default: 1, the posterior, and 0.1, a cold posterior)",
    )
    parser.add_argument("--map-steps", type=int, default=10_000, help="steps of the T=0 (MAP) run (default 10000)")
    parser.add_argument(
        "--warmup-steps", type=int, default=5_000, help="burn-in steps of the posterior run (default 5000)"
    )
    parser.add_argument("--num-samples", type=int, default=25_000, help="posterior steps after burn-in (default 25000)")
    parser.add_argument("--thin", type=int, default=100, help="keep every THIN-th posterior draw (default 100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="a few-second smoke run")
    parser.add_argument("--out", type=Path, default=Path("bnn_digits_results.json"), help="JSON results path")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="progress bars, shown by default as Pyro's MCMC shows them (--no-progress hides them)",
    )
    args = parser.parse_args(argv)
    if args.tiny:
        args.hidden, args.map_steps, args.warmup_steps, args.num_samples, args.thin = 16, 100, 100, 100, 10
    return args


MAP_STEP_SIZE = 0.2  # at T = 0 nothing is adapted: SGD with momentum at this learning rate


class KeepEvery:
    """A ``hook_fn`` for :class:`pyro.infer.MCMC` that keeps every ``thin``-th draw of the sampling phase.

    MCMC's own store holds every draw of every weight (``num_samples x 2,410`` numbers here); with
    ``save_params=[]`` it holds none, and this hook keeps the thinned draws, in constrained space.
    """

    def __init__(self, thin: int):
        self.thin = thin
        self.draws = []

    def __call__(self, kernel, params, stage, i):
        if stage.startswith("Sample") and (i + 1) % self.thin == 0:
            # params are unconstrained; kernel.transforms maps constrained -> unconstrained.
            self.draws.append({name: kernel.transforms[name].inv(value).clone() for name, value in params.items()})

    def stacked(self) -> dict:
        return {name: torch.stack([draw[name] for draw in self.draws]) for name in self.draws[0]}


def run(args, model, x_train, y_train, temperature: float, warmup_steps: int, num_samples: int, thin: int, seed: int):
    """One SGHMC chain through ``pyro.infer.MCMC``; returns the kept draws (every ``thin``-th)."""
    pyro.set_rng_seed(seed)
    if temperature == 0:  # an optimiser: nothing is adapted at T = 0
        options = {"step_size": args.step_size or MAP_STEP_SIZE}
    elif args.step_size is None:  # the package's defaults; 0.1 is only where the adaptation starts
        options = {"step_size": 0.1}
    else:  # a fixed step, nothing adapted: the setting of the figures measured before the adaptive warmup
        options = {"step_size": args.step_size, "adapt_step_size": False, "adapt_mass_matrix": False,
                   "control_variate": None}  # fmt: skip
    kernel = pyro_sgmcmc.SGHMC(
        model,
        friction=args.friction,
        temperature=temperature,
        # Start from a draw of the prior, i.e. a random network initialisation; the default
        # init_to_uniform (U(-2, 2) for every weight) would saturate the tanh units.
        init_strategy=init_to_sample,
        **options,
    )
    keep = KeepEvery(thin)
    mcmc = MCMC(
        kernel,
        num_samples=num_samples,
        warmup_steps=warmup_steps,
        hook_fn=keep,
        save_params=[],  # MCMC itself stores nothing; the hook keeps the thinned draws
        disable_progbar=not args.progress,
    )
    start, cpu_start = time.perf_counter(), time.process_time()
    mcmc.run(x_train, y_train)
    seconds = {"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu_start}
    # kernel.diagnostics() rather than mcmc.diagnostics(): the latter also computes ESS and R-hat
    # of every saved site.
    diagnostics = kernel.diagnostics()
    divergences = len(diagnostics["divergences"]) + diagnostics["warmup divergences"]
    return keep.stacked(), seconds, divergences


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)  # small matrices: one thread is as fast, and robust under load
    x_train, y_train, x_test, y_test = load_data(args.seed)
    num_in, num_classes = x_train.shape[1], int(y_train.max()) + 1
    pyro.set_rng_seed(args.seed)
    net = BayesianMLP(num_in, args.hidden, num_classes, args.prior_scale)
    model = make_model(net, args.batch_size)
    num_weights = sum(p.numel() for p in torch.nn.Linear(num_in, args.hidden).parameters()) + sum(
        p.numel() for p in torch.nn.Linear(args.hidden, num_classes).parameters()
    )
    print(
        f"digits: {len(y_train)} train / {len(y_test)} test images, MLP {num_in}-{args.hidden}-{num_classes} "
        f"({num_weights} weights), minibatch B={args.batch_size}"
    )

    check = check_plate_pattern(net, x_train, y_train, args.batch_size)
    print("\nplate pattern check (network outside `with plate:`):")
    for name, info in check["pattern"].items():
        print(f"  {name:<14} shape {tuple(info['shape'])!s:<10} plates {info['plates']}")
    naive = check["naive"]
    print(
        f"naive pattern (network inside `with plate:`): hidden.weight shape {tuple(naive['hidden.weight shape'])}, "
        f"plates {naive['plates']}, prior scaled by {naive['prior scale']:.2f}; forward pass: {naive['forward error']}"
    )

    # ---------------------------------------------------------------- MAP: temperature 0
    map_steps = args.map_steps
    map_draws, map_seconds, map_divergences = run(args, model, x_train, y_train, 0.0, map_steps - 1, 1, 1, args.seed)
    map_scores = scores(predictive_probs(net, map_draws, x_test)[0], y_test)
    print(
        f"\nMAP (SGHMC, T=0 = SGD with momentum): {map_steps} steps in {map_seconds['wall']:.1f} s wall, "
        f"{map_seconds['cpu']:.1f} s CPU"
    )

    # ---------------------------------------------------------------- posteriors: T = 1, then colder
    posteriors = {}
    for k, temperature in enumerate(args.temperatures):
        draws, seconds, divergences = run(
            args,
            model,
            x_train,
            y_train,
            temperature,
            args.warmup_steps,
            args.num_samples,
            args.thin,
            args.seed + 1 + k,
        )
        steps = args.warmup_steps + args.num_samples
        print(
            f"posterior (SGHMC, T={temperature:g}): {steps} steps in {seconds['wall']:.1f} s wall, "
            f"{seconds['cpu']:.1f} s CPU ({1e6 * seconds['cpu'] / steps:.0f} CPU us/step)"
        )
        probs = predictive_probs(net, draws, x_test)
        single = [scores(p, y_test) for p in probs]
        posteriors[f"T={temperature:g}"] = {
            "temperature": temperature,
            **scores(probs.mean(0), y_test),  # the posterior predictive: average the softmax over draws
            "single_draw_mean_accuracy": sum(s["accuracy"] for s in single) / len(single),
            "single_draw_mean_nll": sum(s["nll"] for s in single) / len(single),
            "num_draws_used": len(probs),
            "steps": steps,
            "seconds": seconds["wall"],
            "cpu_seconds": seconds["cpu"],
            "divergences": divergences,
        }

    print(f"\ntest set ({len(y_test)} images)                       accuracy     NLL")
    print(f"  MAP / SGD (T=0)                                 {map_scores['accuracy']:.4f}   {map_scores['nll']:.4f}")
    for label, p in posteriors.items():
        what = f"posterior predictive, {label} ({p['num_draws_used']} draws)"
        print(f"  {what:<46}  {p['accuracy']:.4f}   {p['nll']:.4f}")
        what = f"  single draw, {label} (average)"
        print(f"  {what:<46}  {p['single_draw_mean_accuracy']:.4f}   {p['single_draw_mean_nll']:.4f}")
    print(f"divergences: MAP {map_divergences}, " + ", ".join(f"{k} {p['divergences']}" for k, p in posteriors.items()))

    results = {
        "config": {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()},
        "data": {"name": "digits", "num_train": len(y_train), "num_test": len(y_test), "num_weights": num_weights},
        "plate_check": check,
        "map": {
            **map_scores,
            "steps": map_steps,
            "seconds": map_seconds["wall"],
            "cpu_seconds": map_seconds["cpu"],
            "divergences": map_divergences,
        },
        "posterior": posteriors[next(iter(posteriors))],  # the first temperature (default T = 1)
        "posteriors": posteriors,
        "versions": {"torch": torch.__version__, "pyro": pyro.__version__, "pyro_sgmcmc": pyro_sgmcmc.__version__},
    }
    scores_all = [results["map"]] + list(posteriors.values())
    if not all(math.isfinite(r[m]) for r in scores_all for m in ("accuracy", "nll")):
        print("warning: non-finite scores")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"results written to {args.out}")
    return results


if __name__ == "__main__":
    main()
