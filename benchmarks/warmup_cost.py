"""What the default warmup costs, and that it costs nothing per step once sampling starts.

One chain of ``SGHMC`` through ``pyro.infer.MCMC`` on a Bayesian logistic regression (d = 20 raw features,
N = 10,000, B = 100; N / B = 100, so ``control_variate="auto"`` centres the gradients). Three kernels:

* ``defaults``: ``SGHMC(model)``: approach, adaptation (metric, step size, auto control variate), sampling;
* ``defaults, no control variate``: ``SGHMC(model, control_variate=None)``;
* ``fixed``: ``SGHMC(model, step_size=..., adapt_step_size=False, adapt_mass_matrix=False,
  control_variate=None)``: the plain kernel, no warmup work.

For each: wall time of the warmup phases (approach, adaptation) and milliseconds per sampling step (median
of ``--repeats`` blocks). The sampling step of ``defaults`` does more maths than ``fixed`` (the
preconditioned update, and with the control variate a second minibatch evaluation); what this script checks
is that no *adaptation* work is left in it: ``defaults, no control variate`` against ``fixed`` differs only
by the mass matrix's product and the jump check.

    python benchmarks/warmup_cost.py [--tiny] [--repeats 5]
"""

from __future__ import annotations

import statistics
import time

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC

from pyro_sgmcmc import SGHMC

if __package__:  # imported as benchmarks.warmup_cost
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness


def make_model(n: int, d: int, batch: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-0.5, 0.5, d)
    x = torch.randn(n, d, generator=generator) * scales
    w_true = torch.randn(d, generator=generator) / scales
    y = torch.bernoulli(torch.sigmoid(x @ w_true / 3), generator=generator)

    def model():
        w = pyro.sample("w", dist.Normal(torch.zeros(d), 10.0).to_event(1))
        with pyro.plate("data", n, subsample_size=batch) as idx:
            pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

    return model


def timed_run(kernel, warmup: int, samples: int, block: int) -> dict:
    marks = {}

    def hook(k, params, stage, t):
        if stage == "Warmup" and k.phase != "approach" and "approach_end" not in marks:
            marks["approach_end"] = time.perf_counter()
        if stage == "Sample" and t % block == 0:
            marks.setdefault("blocks", []).append(time.perf_counter())

    pyro.set_rng_seed(0)
    start = time.perf_counter()
    MCMC(kernel, num_samples=samples, warmup_steps=warmup, disable_progbar=True, hook_fn=hook).run()
    blocks = marks["blocks"]
    per_step = [(b - a) / block * 1e3 for a, b in zip(blocks, blocks[1:])]
    return {
        "approach_s": marks.get("approach_end", start) - start,
        "adaptation_s": blocks[0] - marks.get("approach_end", start),
        "ms_per_sampling_step": statistics.median(per_step),
        "ms_per_sampling_step_min": min(per_step),
    }


def main(argv=None) -> dict:
    parser = harness.parser(__doc__, None, "N = 2,000, 200 + 200 steps: a smoke test")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    n, warmup, samples = (2000, 200, 200) if args.tiny else (10_000, 2000, 5000)
    block = samples // max(2, args.repeats)
    model = make_model(n, 20, 100 if not args.tiny else 20)
    kernels = {
        "defaults": lambda: SGHMC(model),
        "defaults, no control variate": lambda: SGHMC(model, control_variate=None),
        "fixed": lambda: SGHMC(model, step_size=0.01, **harness.SAME_MATHS),
    }
    results = {"context": harness.run_context(), "kernels": {}}
    print(harness.context_line(results["context"]), flush=True)
    for name, make in kernels.items():
        results["kernels"][name] = timed_run(make(), warmup, samples, block)
        r = results["kernels"][name]
        print(
            f"{name:30s} approach {r['approach_s']:6.2f} s  adaptation {r['adaptation_s']:6.2f} s  "
            f"sampling {r['ms_per_sampling_step']:.3f} ms/step (min {r['ms_per_sampling_step_min']:.3f})"
        )
    results["load_average_end"] = harness.load_average()
    print(harness.context_line(results["context"], results["load_average_end"]))
    if args.out:
        harness.write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
