"""HAP against the pooling baselines on TU datasets, one protocol for all.

Every (dataset, model) pair runs `hmgraph.classify.run`; target: HAP best
of the harness on at least 3 of the 4 datasets (bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import common

os.environ.setdefault("OUTDATED_IGNORE", "1")

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROOT = REPO.parent / "shared" / "data"
DATASETS = ["MUTAG", "PROTEINS", "NCI1", "ENZYMES"]
MODELS = ["hap", "hap-sum", "gin", "gin-mean", "topk", "sagpool",
          "diffpool"]
# A model's configurations, picked per fold on validation (README).
FAMILIES = {"hap": ["hap", "hap-sum"], "gin": ["gin", "gin-mean"]}
# Relative cost of one epoch (measured on 2 cores), to start big jobs first.
COST = {"NCI1": 8.0, "PROTEINS": 3.0, "ENZYMES": 1.5, "MUTAG": 0.3}
# {source: [protocol, {model: {dataset: "mean ± std"}}]}, 10-fold, in %.
PUBLISHED = json.loads(Path(__file__).with_name("pooling_published.json")
                       .read_text(encoding="utf-8"))
SETTINGS = ("folds", "epochs", "patience", "batch_size", "hidden", "lr",
            "seed")


def _job(dataset, model, settings, root, threads):
    """One (dataset, model) cross-validation in a worker process."""
    import torch

    from hmgraph.classify import ClassifyConfig, load_graph_dataset, run

    torch.set_num_threads(threads)
    data = load_graph_dataset(dataset, root)
    config = ClassifyConfig(dataset=dataset, root=str(root), model=model,
                            out=str(Path(settings.pop("out")) / "runs" /
                                    f"{dataset}-{model}"),
                            progress=False, **settings)
    start = time.perf_counter()
    result = run(config, data)
    for fold in result["folds"]:
        fold.pop("history")
    result["wall_seconds"] = time.perf_counter() - start
    return result


def _max_folds(text, folds):
    """``"3"`` or ``"NCI1=3,PROTEINS=5"`` -> {dataset: folds run}."""
    limits = {}
    for part in filter(None, text.split(",")):
        name, _, value = part.rpartition("=")
        limits[name or "*"] = int(value)
    return lambda dataset: limits.get(dataset, limits.get("*", folds))


def family_of(model):
    """The family (`FAMILIES`) a configuration belongs to."""
    return next((f for f, members in FAMILIES.items() if model in members),
                model)


def select_on_validation(records):
    """Per (dataset, family): each fold's pick among the family's runs,
    ``{(dataset, family): {"summary": ..., "picks": {model: folds}}}``,
    over the folds every configuration of the family ran."""
    from hmgraph.classify import summarize

    groups = {}
    for r in records:
        groups.setdefault((r["dataset"], family_of(r["model"])), []).append(r)
    out = {}
    for key, runs in groups.items():
        order = FAMILIES.get(key[1], [key[1]])
        runs.sort(key=lambda r: order.index(r["model"]))
        folds = min(len(r["folds"]) for r in runs)
        picks, chosen = {}, []
        for fold in range(folds):
            best = max(runs, key=lambda r: (
                r["folds"][fold]["valid"], -r["folds"][fold]["valid_loss"],
                -order.index(r["model"])))
            chosen.append(best["folds"][fold])
            picks[best["model"]] = picks.get(best["model"], 0) + 1
        out[key] = {"summary": summarize(chosen), "picks": picks}
    return out


def targets(records, datasets, selected):
    """Per dataset: the best model and HAP's margin to the best other,
    models compared by their picks (`select_on_validation`)."""
    out = {}
    for dataset in datasets:
        means = {family: v["summary"]["test_mean"]
                 for (d, family), v in selected.items() if d == dataset}
        if "hap" not in means or len(means) < 2:
            continue
        best_other = max((m for m in means if m != "hap"),
                         key=means.__getitem__)
        # A tie is not a win for HAP.
        best = "hap" if means["hap"] > means[best_other] else best_other
        out[dataset] = {"best": best, "hap": means["hap"],
                        "best_other": best_other,
                        "best_other_mean": means[best_other],
                        "margin_points": 100 * (means["hap"]
                                                - means[best_other])}
    wins = sum(t["best"] == "hap" for t in out.values())
    return {"per_dataset": out, "hap_wins": wins,
            "pass": wins >= 3 and len(out) == 4,
            "fixed": fixed_settings(records, datasets)}


def fixed_settings(records, datasets):
    """Per HAP configuration: ``wins`` and per dataset the margin in
    points to the best non-HAP configuration (no selection)."""
    means = {(r["dataset"], r["model"]): r["summary"]["test_mean"]
             for r in records}
    out = {}
    for config in FAMILIES["hap"]:
        margins = {}
        for dataset in datasets:
            others = [v for (d, m), v in means.items()
                      if d == dataset and family_of(m) != "hap"]
            if (dataset, config) in means and others:
                margins[dataset] = 100 * (means[dataset, config]
                                          - max(others))
        if margins:
            out[config] = {"wins": sum(m > 0 for m in margins.values()),
                           "margins": margins}
    return out


def markdown(report) -> str:
    config, records = report["config"], report["records"]
    datasets, models = config["datasets"], config["models"]
    by_key = {(r["dataset"], r["model"]): r for r in records}
    lines = [
        "# Graph classification: HAP vs pooling baselines",
        "",
        f"Protocol (every cell): stratified {config['folds']}-fold CV, "
        "validation carved from each training fold (8:1:1), selection and "
        f"early stopping (patience {config['patience']}) on validation "
        "only; test accuracy % mean ± std over the folds run. "
        f"Adam lr {config['lr']}, batch {config['batch_size']}, hidden "
        f"{config['hidden']}, at most {config['epochs']} epochs, 3 levels, "
        f"seed {config['seed']}.",
    ]
    selected = {(s["dataset"], s["model"]): s
                for s in report.get("selected", [])}
    families = list(dict.fromkeys(family_of(m) for m in models))
    choose = len(families) < len(models)

    def table(rows, lookup, bold):
        out = []
        for row in rows:
            cells = [row]
            for dataset in datasets:
                entry = lookup.get((dataset, row))
                s = entry and entry["summary"]
                cell = f"{100 * s['test_mean']:.2f} ± " \
                    f"{100 * s['test_std']:.2f}" if s else "—"
                if entry and entry["summary"]["folds_run"] < config["folds"]:
                    cell += f" ({entry['summary']['folds_run']} folds)"
                if entry and len(entry.get("picks", {})) > 1:
                    cell += " (" + ", ".join(
                        f"{m} {n}" for m, n in entry["picks"].items()) + ")"
                best = report["targets"]["per_dataset"].get(dataset, {})
                if bold and best.get("best") == row:
                    cell = f"**{cell}**"
                cells.append(cell)
            out.append(cells)
        return ["", common.markdown_table(["model", *datasets], out)]

    if choose:
        lines += ["", "Every configuration (one fixed setting each):"]
    lines += table(models, by_key, bold=not choose)
    if choose:
        lines += ["", "Models compared (the target's table), each fold's "
                  "pick on validation (bench/README.md): " + "; ".join(
                      f"{f}: {', '.join(FAMILIES[f])}"
                      for f in families if f in FAMILIES)
                  + "; in brackets: folds won by each configuration."]
        lines += table(families, selected, bold=True)
    limited = {d: n for d, n in config["folds_run"].items()
               if n < config["folds"]}
    if limited:
        lines += ["", f"**Fewer folds than the protocol's {config['folds']}"
                  "**: " + ", ".join(f"{d}: first {n} folds" for d, n in
                                     limited.items()) + "."]
    cost = [[m, *(f"{r['summary']['epochs_mean']:.0f} ep, "
                  f"{r['wall_seconds']:.0f} s" if r else "—"
                  for r in (by_key.get((d, m)) for d in datasets))]
            for m in models]
    published = [[source, model, *(values.get(d, "—") for d in datasets)]
                 for source, (_, table) in PUBLISHED.items()
                 for model, values in table.items()]
    lines += ["", "Mean epochs run per fold (early stopping) and wall "
              "seconds per cell:", "",
              common.markdown_table(["model", *datasets], cost), "",
              "## Published figures (their protocols, not ours)", "",
              common.markdown_table(["source", "model", *datasets],
                                    published)]
    lines += ["", "Protocols of the cited figures (Errica et al.'s is "
              "ours, see bench/README.md):", ""]
    lines += [f"- **{source}**: {protocol}." for source, (protocol, _) in
              PUBLISHED.items()]
    # Target.
    t = report["targets"]
    lines += ["", "## Target: HAP best of the harness on >= 3 of 4 "
              "datasets", ""]
    for dataset, row in t["per_dataset"].items():
        verdict = "HAP best" if row["best"] == "hap" else (
            f"best is {row['best']}")
        lines.append(f"- {dataset}: {verdict}; HAP {100 * row['hap']:.2f} "
                     f"vs {row['best_other']} "
                     f"{100 * row['best_other_mean']:.2f} "
                     f"({row['margin_points']:+.2f} points).")
    lines += ["", common.targets_table([common.target(
        1, f"datasets (of {len(t['per_dataset'])} run, 4 needed) where HAP "
        "is best of the harness", t["hap_wins"] if len(t["per_dataset"])
        == 4 else None, ">=", 3)])]
    if choose:
        lines += ["", "Without selection, each HAP configuration against "
                  "the best of every other configuration:", ""]
        lines += [f"- {config}: best on {row['wins']} of "
                  f"{len(row['margins'])} (" + ", ".join(
                      f"{d} {m:+.2f}" for d, m in row["margins"].items())
                  + " points)." for config, row in t["fixed"].items()]
    if report.get("note"):
        lines += ["", report["note"]]
    return "\n".join(lines) + "\n"


def write(report, out):
    """Targets, picks and both files (JSON, markdown), atomically."""
    selected = select_on_validation(report["records"])
    report["targets"] = targets(report["records"],
                                report["config"]["datasets"], selected)
    report["selected"] = [{"dataset": d, "model": f, **v}
                          for (d, f), v in selected.items()]
    common.write_results(report, markdown(report), out)


def merge(paths):
    """One report from runs of the same protocol (other models or data);
    SystemExit where settings or folds differ or a pair repeats."""
    reports = [json.loads(Path(p).read_text()) for p in paths]
    base = reports[0]
    config = dict(base["config"], folds_run=dict(base["config"]["folds_run"]))
    commits = [r.get("commit") for r in reports]
    merged = {"config": config, "records": [],
              "commit": commits[0] if all(c == commits[0] for c in commits)
              else {"sha": None, "dirty": None, "merged": commits},
              "note": base.get("note", ""),
              "environment": base.get("environment", {}),
              "wall_seconds": 0.0, "merged_from": [str(p) for p in paths]}
    seen = set()
    config["datasets"], config["models"] = [], []
    for path, report in zip(paths, reports, strict=True):
        new = report["config"]
        problems = [f"{k}={new[k]!r} differs from {paths[0]}'s "
                    f"{base['config'][k]!r}; only runs of one protocol can "
                    "be merged" for k in SETTINGS
                    if new[k] != base["config"][k]]
        problems += [f"{d} ran {n} folds, another run "
                     f"{config['folds_run'][d]}; merge needs equal folds"
                     for d, n in new["folds_run"].items()
                     if config["folds_run"].setdefault(d, n) != n]
        for pair in ((r["dataset"], r["model"]) for r in report["records"]):
            if pair in seen:
                problems.append(f"{pair[0]} {pair[1]} is in more than one "
                                "run; merge each pair once")
            seen.add(pair)
        if problems:
            raise SystemExit(f"{path}: {problems[0]}")
        merged["records"] += report["records"]
        for key in ("datasets", "models"):
            config[key] += [v for v in new[key] if v not in config[key]]
        merged["wall_seconds"] += report.get("wall_seconds", 0.0)
    order = {m: i for i, m in enumerate(MODELS)}
    config["models"].sort(key=lambda m: order.get(m, len(order)))
    return merged


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kind, default in (
            ("--datasets", str, ",".join(DATASETS)),
            ("--models", str, ",".join(MODELS)),
            ("--root", str, str(DEFAULT_ROOT)), ("--folds", int, 10),
            ("--epochs", int, 100), ("--patience", int, 20),
            ("--batch-size", int, 128), ("--hidden", int, 64),
            ("--lr", float, 0.001), ("--seed", int, 0),
            ("--workers", int, 2), ("--note", str, ""),
            ("--out", str, str(REPO / "bench" / "results" / "pooling.json"))):
        parser.add_argument(flag, type=kind, default=default)
    parser.add_argument("--max-folds", default="",
                        help="folds run: N, or per dataset NCI1=3,MUTAG=10 "
                        "(default: all)")
    parser.add_argument("--render", action="store_true",
                        help="only rewrite the markdown from --out's JSON")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="only merge runs of one protocol into --out")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: MUTAG, 2 folds of 10, 3 epochs, "
                        "output /tmp/pooling_quick.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.datasets, args.max_folds, args.epochs = "MUTAG", "2", 3
        args.out = "/tmp/pooling_quick.json"
    from hmgraph.distributed.worker import watch_parent

    if args.render or args.merge:
        report = merge(args.merge) if args.merge else json.loads(
            Path(args.out).read_text())
        report["note"] = args.note or report.get("note", "")
        # The commit of the runs, not of this rendering (unknown: None).
        report["commit"] = report.get("commit") or {"sha": None,
                                                    "dirty": None}
        write(report, Path(args.out))
        print(markdown(report))
        return 0
    datasets, models = args.datasets.split(","), args.models.split(",")
    folds_run = _max_folds(args.max_folds, args.folds)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {k: getattr(args, k) for k in (*SETTINGS, "workers", "root")}
    config.update(datasets=datasets, models=models, folds_run={
        d: min(folds_run(d), args.folds) for d in datasets})
    report = {"commit": common.commit(), "config": config, "records": [],
              "note": args.note, "environment": common.environment()}
    jobs = sorted(((d, m) for d in datasets for m in models),
                  key=lambda job: -COST.get(job[0], 1.0))
    threads = 1 if args.workers > 1 else max(1, os.cpu_count() or 1)
    start = time.perf_counter()

    def save():
        report["wall_seconds"] = time.perf_counter() - start
        write(report, out)

    # Workers stop with this process, even when it is killed outright.
    with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn"),
                             initializer=watch_parent,
                             initargs=(os.getpid(),)) as pool:
        futures = {}
        for dataset, model in jobs:
            settings = dict({k: config[k] for k in SETTINGS},
                            max_folds=config["folds_run"][dataset],
                            out=str(REPO / "runs" / "bench-pooling"))
            futures[pool.submit(_job, dataset, model, settings, args.root,
                                threads)] = (dataset, model)
        for future in as_completed(futures):
            dataset, model = futures[future]
            result = future.result()
            report["records"].append({
                "dataset": dataset, "model": model,
                "summary": result["summary"], "protocol": result["protocol"],
                "folds": result["folds"],
                "wall_seconds": result["wall_seconds"]})
            save()
            s = result["summary"]
            print(f"{dataset:9s} {model:9s} {100 * s['test_mean']:6.2f} ± "
                  f"{100 * s['test_std']:5.2f}  ({s['folds_run']} folds, "
                  f"{result['wall_seconds']:.0f} s, total "
                  f"{time.perf_counter() - start:.0f} s)", flush=True)
    save()
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
