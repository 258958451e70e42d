"""The text tree: nesting, start order, annotations, and a visible mark for a missing parent."""

from __future__ import annotations

from typing import Any

from ragtoll.instrumentation.render_trace import describe, render_tree


def span(name: str, span_id: str, parent: str = "", start: int = 0, **attributes: Any) -> dict[str, Any]:
    return {"name": name, "span_id": span_id, "parent_span_id": parent, "start": start,
            "end": start + 2_500_000, "attributes": attributes, "resource": {"service.name": "ragtoll"}}


def test_tree_nests_children_in_start_order_with_annotations() -> None:
    spans = [
        span("chat m", "c2", "r", 30, **{"gen_ai.usage.input_tokens": 12, "ragtoll.budget.max_steps.used": 2,
                                         "ragtoll.budget.max_steps.limit": 4}),
        span("ragtoll.task", "r", "", 0, **{"ragtoll.task.id": "t1", "ragtoll.cost.usd": 0.0012}),
        span("retrieval docs", "c1", "r", 10, **{"ragtoll.budget.exceeded.dimension": "max_retrieval_calls"}),
        span("POST", "h", "c2", 31),
    ]
    assert render_tree(spans, durations=False).splitlines() == [
        "ragtoll.task  [ragtoll]  task t1 · cost $0.0012",
        "├─ retrieval docs  [ragtoll]  REJECTED max_retrieval_calls",
        "└─ chat m  [ragtoll]  in 12 · steps 2/4",
        "   └─ POST  [ragtoll]",
    ]
    assert render_tree(spans).splitlines()[0] == "ragtoll.task  [ragtoll]  2.5 ms · task t1 · cost $0.0012"


def test_a_span_whose_parent_is_missing_is_drawn_as_a_marked_root() -> None:
    text = render_tree([span("POST /openai", "s", "aaaa")], durations=False)
    assert text == "POST /openai  [ragtoll]  (parent not exported)"


def test_describe_formats_fractional_budgets() -> None:
    attrs = {"ragtoll.budget.max_cost_usd.used": 0.000504, "ragtoll.budget.max_cost_usd.limit": 0.01}
    assert describe({"name": "x", "attributes": attrs}) == "cost_usd 0.000504/0.01"
