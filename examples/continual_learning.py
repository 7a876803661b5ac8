"""Continual learning on split digits: Laplace-prior propagation against plain MAP training.

Five tasks arrive one after the other: scikit-learn's 8x8 digits split into the class pairs
(0, 1), (2, 3), (4, 5), (6, 7), (8, 9). One network, an MLP ``64 -> H (tanh) -> 10`` with
``PyroSample`` weights, is trained on each task in turn and never sees an earlier task's data
again. Each task uses only the two logits of its own classes (a "multi-head" output layer sharing
the hidden layer), so forgetting happens in the shared weights.

Two learners, identical except for the prior of each new task:

* **MAP (SGD, no memory)**: every task starts from the previous weights with the original prior
  ``N(0, 1)``: plain (regularised) training, which overwrites what the shared weights knew (and
  the prior, acting as weight decay, pulls the earlier heads' weights, which no longer see data,
  back towards zero);
* **Laplace propagation**: after task ``t``, :meth:`~pyro_sgmcmc.guides.AutoLaplace.laplace_approximation`
  (``diag_ggn``) gives :math:`q_t(\\theta) = \\mathcal N(\\theta_t, \\Lambda_t^{-1})`, and
  :meth:`~pyro_sgmcmc.guides.LaplaceApproximation.as_prior` makes it the prior of task ``t + 1``,
  :math:`p_{t+1}(\\theta) = q_t(\\theta) \\approx p(\\theta \\mid \\mathcal D_1, \\dots, \\mathcal D_t)`.
  The MAP of task ``t + 1`` then approximately maximises the posterior of all tasks so far
  (the online Laplace / EWC recursion, with no extra weighting).

Both fit the MAP with ``SVI(model, AutoLaplace(model), Adam, Trace_ELBO())`` on minibatches of a
subsampled plate. After each episode (one task learned) the script records the test loss (mean
negative log-likelihood of the MAP network over that task's test images, two-way softmax) and the
test accuracy of every task, as in Figures 5-6 of "Scalable Bayesian Learning with posteriors" at
CPU scale: a task's loss should stay low after later tasks for Laplace and climb for MAP.

Outputs in ``--out`` (a directory): ``continual_learning.json`` (the loss and accuracy matrices
``[episode][task]``, the average final loss and the forgetting of each learner) and
``continual_learning.png`` (one panel per task: test loss against episode).

Run it::

    python examples/continual_learning.py                # 8 s of CPU, 9 s wall on 2 shared cores (2026-11-26)
    python examples/continual_learning.py --tiny         # a few seconds, smoke test only
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide.initialization import init_to_sample, init_to_value
from pyro.nn import PyroModule, PyroSample
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from pyro_sgmcmc.guides import AutoLaplace

TASKS = [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]


def load_tasks(seed: int):
    """``[(x_train, y_train, x_test, y_test)]`` per class pair; labels stay the digits 0-9."""
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    tasks = []
    for classes in TASKS:
        keep = (y == classes[0]) | (y == classes[1])
        x_train, x_test, y_train, y_test = train_test_split(
            x[keep], y[keep], test_size=0.3, random_state=seed, stratify=y[keep]
        )
        tasks.append((x_train, y_train, x_test, y_test))
    return tasks


class Network(PyroModule):
    """``64 -> hidden (tanh) -> 10`` whose weights are ``PyroSample`` sites with the given priors."""

    def __init__(self, hidden: int, priors: dict):
        super().__init__()
        self.hidden = PyroModule[torch.nn.Linear](64, hidden)
        self.out = PyroModule[torch.nn.Linear](hidden, 10)
        self.hidden.weight = PyroSample(priors["hidden.weight"])
        self.hidden.bias = PyroSample(priors["hidden.bias"])
        self.out.weight = PyroSample(priors["out.weight"])
        self.out.bias = PyroSample(priors["out.bias"])

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(x)))


def initial_priors(hidden: int) -> dict:
    normal = dist.Normal(0.0, 1.0)
    return {
        "hidden.weight": normal.expand([hidden, 64]).to_event(2),
        "hidden.bias": normal.expand([hidden]).to_event(1),
        "out.weight": normal.expand([10, hidden]).to_event(2),
        "out.bias": normal.expand([10]).to_event(1),
    }


def task_logits(net_output: torch.Tensor, classes) -> torch.Tensor:
    """The two logits of the task's classes (its "head")."""
    return net_output[..., list(classes)]


def make_model(net: Network, classes, batch_size: int):
    def model(x, y):
        plate = pyro.plate("data", len(y), subsample_size=min(batch_size, len(y)))
        logits = task_logits(net(x[plate.indices]), classes)  # the network outside the plate
        with plate:
            pyro.sample("y", dist.Categorical(logits=logits), obs=(y[plate.indices] == classes[1]).long())

    return model


def fit_task(net, classes, x, y, init_values, args) -> AutoLaplace:
    model = make_model(net, classes, args.batch_size)
    init = init_to_sample if init_values is None else init_to_value(values=init_values)
    guide = AutoLaplace(model, curvature="diag_ggn", init_loc_fn=init, disable_progbar=True)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": args.lr}), Trace_ELBO())
    steps = args.epochs * max(1, len(y) // args.batch_size)
    for _ in range(steps):
        svi.step(x, y)
    return guide


@torch.no_grad()
def evaluate(params: dict, hidden: int, tasks) -> tuple:
    """Test loss (mean NLL, two-way softmax) and accuracy of the MAP network on every task."""
    net = Network(hidden, initial_priors(hidden))
    run = pyro.poutine.condition(net, data=params)
    losses, accuracies = [], []
    for classes, (_, _, x_test, y_test) in zip(TASKS, tasks):
        logits = task_logits(run(x_test), classes)
        target = (y_test == classes[1]).long()
        losses.append(torch.nn.functional.cross_entropy(logits, target).item())
        accuracies.append((logits.argmax(-1) == target).float().mean().item())
    return losses, accuracies


def run_learner(method: str, tasks, args) -> dict:
    pyro.set_rng_seed(args.seed)
    priors = initial_priors(args.hidden)
    values = None
    loss_matrix, accuracy_matrix = [], []
    for episode, (classes, (x_train, y_train, _, _)) in enumerate(zip(TASKS, tasks)):
        pyro.clear_param_store()
        net = Network(args.hidden, priors)
        guide = fit_task(net, classes, x_train, y_train, values, args)
        values = {name: value.detach() for name, value in guide.median(x_train, y_train).items()}
        if method == "laplace":
            laplace = guide.laplace_approximation(x_train, y_train)
            priors = laplace.as_prior()  # the posterior of tasks 1..t is the prior of task t+1
        losses, accuracies = evaluate(values, args.hidden, tasks)
        loss_matrix.append(losses)
        accuracy_matrix.append(accuracies)
        print(f"{method:8s} episode {episode + 1}: " + " ".join(f"{v:.3f}" for v in losses), flush=True)
    num = len(TASKS)
    final = loss_matrix[-1]
    # forgetting of task t: its final loss minus its loss right after it was learned
    forgetting = [final[t] - loss_matrix[t][t] for t in range(num - 1)]
    return {
        "test_loss": loss_matrix,
        "test_accuracy": accuracy_matrix,
        "final_mean_test_loss": sum(final) / num,
        "final_mean_test_accuracy": sum(accuracy_matrix[-1]) / num,
        "mean_forgetting": sum(forgetting) / len(forgetting),
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    num = len(TASKS)
    episodes = list(range(1, num + 1))
    fig, axes = plt.subplots(1, num, figsize=(3.0 * num, 2.8), sharey=True)
    styles = {"map": ("MAP / SGD (no memory)", "tab:red"), "laplace": ("Laplace propagation", "tab:blue")}
    for task, ax in enumerate(axes):
        for method, (label, color) in styles.items():
            losses = [row[task] for row in results[method]["test_loss"]]
            ax.plot(episodes[task:], losses[task:], "o-", color=color, label=label)
        ax.axvspan(task + 0.5, task + 1.5, color="0.9")
        ax.set_title(f"task {task + 1}: digits {TASKS[task]}")
        ax.set_xlabel("episode (tasks learned)")
        ax.set_xticks(episodes)
    axes[0].set_ylabel("test loss (NLL)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a few seconds: smoke test only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("continual_learning_out"))
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args(argv)
    args.hidden = args.hidden or (8 if args.tiny else 50)
    args.epochs = args.epochs or (2 if args.tiny else 40)
    torch.set_num_threads(1)
    start = time.perf_counter()
    tasks = load_tasks(args.seed)
    results = {
        "config": {"tiny": args.tiny, "seed": args.seed, "hidden": args.hidden, "epochs": args.epochs,
                   "batch_size": args.batch_size, "lr": args.lr, "tasks": TASKS, "curvature": "diag_ggn"},
        "map": run_learner("map", tasks, args),
        "laplace": run_learner("laplace", tasks, args),
    }  # fmt: skip
    results["seconds"] = time.perf_counter() - start
    results["versions"] = {"torch": torch.__version__, "pyro": pyro.__version__}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "continual_learning.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out / "continual_learning.png")
    for method in ("map", "laplace"):
        r = results[method]
        print(f"{method}: final mean test loss {r['final_mean_test_loss']:.3f}, "
              f"accuracy {r['final_mean_test_accuracy']:.3f}, mean forgetting {r['mean_forgetting']:.3f}")  # fmt: skip
    print(f"{results['seconds']:.0f} s; results in {args.out}")
    return results


if __name__ == "__main__":
    main()
