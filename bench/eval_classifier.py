"""Accuracy and speed of the query-complexity classifier on the labelled question set.

    python bench/eval_classifier.py --split test          # the number to report
    python bench/eval_classifier.py --split dev --errors  # what to look at while tuning

Rules are tuned on `dev` only. `test` is hash-assigned from the first 8 domains; `holdout` is
6 further domains written after the rules were frozen. Both are for reporting only. Prints accuracy, per-class
precision/recall/F1, the confusion matrix, per-domain accuracy and the mean time per query.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from importlib import resources

from ragtoll.proxy.core.classifier import CLASSES, classify


def load(split: str) -> list[dict[str, str]]:
    text = resources.files("ragtoll.proxy.data").joinpath("classifier_questions.jsonl").read_text("utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [r for r in rows if split == "all" or r["split"] == split]


def evaluate(rows: list[dict[str, str]]) -> dict[str, object]:
    """Pure scoring: accuracy, per-class precision/recall, confusion counts, misclassified rows."""
    confusion: Counter[tuple[str, str]] = Counter()
    errors = []
    for row in rows:
        predicted, reason = classify(row["q"])
        confusion[(row["label"], predicted)] += 1
        if predicted != row["label"]:
            errors.append((row["label"], predicted, reason, row["q"]))
    total = len(rows)
    correct = sum(n for (gold, pred), n in confusion.items() if gold == pred)
    per_class = {}
    for c in CLASSES:
        tp = confusion[(c, c)]
        predicted_c = sum(n for (_, p), n in confusion.items() if p == c)
        gold_c = sum(n for (g, _), n in confusion.items() if g == c)
        precision = tp / predicted_c if predicted_c else 0.0
        recall = tp / gold_c if gold_c else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class[c] = (precision, recall, f1, gold_c)
    return {
        "total": total,
        "accuracy": correct / total if total else 0.0,
        "per_class": per_class,
        "confusion": confusion,
        "errors": errors,
    }


def mean_us_per_query(rows: list[dict[str, str]], rounds: int = 20) -> float:
    queries = [r["q"] for r in rows]
    start = time.perf_counter()
    for _ in range(rounds):
        for q in queries:
            classify(q)
    return (time.perf_counter() - start) / (rounds * len(queries)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=("dev", "test", "holdout", "all"), default="test")
    parser.add_argument("--errors", action="store_true", help="list misclassified questions")
    args = parser.parse_args()
    rows = load(args.split)
    result = evaluate(rows)
    print(f"split={args.split}  n={result['total']}  accuracy={result['accuracy']:.3f}")
    print()
    print(f"{'class':<15}{'precision':>10}{'recall':>8}{'f1':>7}{'n':>5}")
    per_class = result["per_class"]
    assert isinstance(per_class, dict)
    for c, (p, r, f, n) in per_class.items():
        print(f"{c:<15}{p:>10.3f}{r:>8.3f}{f:>7.3f}{n:>5}")
    print()
    print("confusion (rows = gold, columns = predicted)")
    short = {c: c[:13] for c in CLASSES}
    print(f"{'':<15}" + "".join(f"{short[c]:>15}" for c in CLASSES))
    confusion = result["confusion"]
    assert isinstance(confusion, Counter)
    for g in CLASSES:
        print(f"{g:<15}" + "".join(f"{confusion[(g, p)]:>15}" for p in CLASSES))
    print()
    domains = sorted({r["domain"] for r in rows})
    print("accuracy by domain: " + "  ".join(
        f"{d}={evaluate([r for r in rows if r['domain'] == d])['accuracy']:.2f}" for d in domains
    ))
    print(f"mean time per query: {mean_us_per_query(rows):.1f} us")
    if args.errors:
        print()
        errors = result["errors"]
        assert isinstance(errors, list)
        for gold, predicted, reason, q in errors:
            print(f"{gold:>13} -> {predicted:<13} [{reason}] {q}")


if __name__ == "__main__":
    main()
