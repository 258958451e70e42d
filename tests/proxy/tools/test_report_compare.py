"""`ragtoll report` over several runs: the numbers behind each panel, the figure, the command line."""

from __future__ import annotations

import itertools
import pathlib
import subprocess
import sys
from typing import Any

import orjson
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text
from PIL import Image
from ragtoll.proxy.cli import main
from ragtoll.proxy.tools import report, report_compare, report_plot

FIXTURE = pathlib.Path(__file__).parents[3] / "tests" / "fixtures" / "task_records.jsonl"
SHADOW_BLUE, ENFORCED_ORANGE = (0x00, 0x72, 0xB2), (0xE6, 0x9F, 0x00)  # report_plot.RUN_COLOURS[:2]


def demo_like_runs() -> list[report_compare.Run]:
    """Two runs of the same workload as the demo writes them: shadow (would_reject) and enforced."""
    fixture = report.read_jsonl(str(FIXTURE))
    shadow = [
        dict(
            r,
            task_id=f"demo-ab12cd-shadow-{r['task_id']}",
            exhausted=None,
            rejections={},
            would_reject=dict(r["rejections"]) or {"max_rerank_calls": 2},
        )
        for r in fixture
    ]
    enforced = [
        dict(
            r,
            task_id=f"demo-ab12cd-enforced-{r['task_id']}",
            cost_usd=float(r["cost_usd"]) / 2,
            retrieval_calls=1,
            would_reject={},
        )
        for r in fixture
    ]
    return [report_compare.Run("shadow", shadow), report_compare.Run("enforced", enforced)]


def write_jsonl(path: pathlib.Path, records: list[dict[str, Any]]) -> str:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return str(path)


# ---- the numbers behind the panels ---------------------------------------------------------------


def test_cost_and_retrieval_panels_are_the_means_per_group_of_each_run() -> None:
    shadow, enforced = demo_like_runs()
    cost = report_compare.means([shadow, enforced], "class", "cost_usd")
    # multi_hop: b1..b4 cost 0.005, 0.006, 0.007, 0.03
    assert cost["shadow"]["multi_hop"] == pytest.approx((0.005 + 0.006 + 0.007 + 0.03) / 4)
    assert cost["enforced"]["multi_hop"] == pytest.approx(cost["shadow"]["multi_hop"] / 2)
    retrieval = report_compare.means([shadow, enforced], "class", "retrieval_calls")
    assert retrieval["enforced"] == {"multi_hop": 1, "procedural": 1, "simple_fact": 1}
    assert retrieval["shadow"]["simple_fact"] == pytest.approx(11 / 5)
    assert report_compare.groups_of([shadow, enforced], "class") == ["multi_hop", "procedural", "simple_fact"]


def test_accuracy_panel_counts_only_judged_tasks() -> None:
    acc = report_compare.accuracy(demo_like_runs(), "class")
    simple = acc["shadow"]["simple_fact"]  # t6 has no outcome posted
    assert (simple.correct, simple.judged, simple.tasks, simple.rate) == (2, 4, 5, 0.5)
    assert acc["enforced"]["all"].rate == pytest.approx(5 / 9)


def test_budget_panel_counts_tasks_that_hit_each_limit_refused_or_would_be() -> None:
    shadow, enforced = demo_like_runs()
    groups = report_compare.groups_of([shadow, enforced], "class")
    would = report_compare.budget_hits(shadow, "class", groups)
    assert (would.shadow, would.refused) == (True, False)
    assert would.tasks == {"multi_hop": 4, "procedural": 1, "simple_fact": 5}
    # every fixture task without rejections got {"max_rerank_calls": 2} would-rejections
    assert would.tasks_hit["max_rerank_calls"] == {"multi_hop": 3, "procedural": 1, "simple_fact": 4}
    assert would.calls["max_rerank_calls"]["multi_hop"] == 6
    hit = report_compare.budget_hits(enforced, "class", groups)
    assert (hit.shadow, hit.refused) == (False, True)
    # b4 was refused on steps and on cost (a call each); t5 on retrieval calls
    assert hit.tasks_hit == {
        "max_steps": {"multi_hop": 1},
        "max_cost_usd": {"multi_hop": 1},
        "max_retrieval_calls": {"simple_fact": 1},
    }
    assert hit.calls["max_cost_usd"] == {"multi_hop": 1}
    assert report_compare.hit_dimensions([would, hit]) == [
        "max_steps",
        "max_retrieval_calls",
        "max_rerank_calls",
        "max_cost_usd",
    ]


def test_tasks_are_matched_across_runs_by_what_their_ids_do_not_share() -> None:
    ids = ["demo-ab12cd-enforced-q01", "demo-ab12cd-enforced-q08", "demo-ab12cd-enforced-q10-x"]
    assert report_compare.task_keys([{"task_id": i} for i in ids]) == dict(zip(ids, ["q01", "q08", "q10-x"]))
    plain = ["t1", "t2"]
    assert report_compare.task_keys([{"task_id": i} for i in plain]) == {"t1": "t1", "t2": "t2"}
    # common ends are stripped as whole parts: run-7/a-end and run-7/b-end keep a and b, not "" or "-"
    assert report_compare.task_keys([{"task_id": "run-7/a-end"}, {"task_id": "run-7/b-end"}]) == {
        "run-7/a-end": "a",
        "run-7/b-end": "b",
    }
    assert report_compare.task_keys([{"task_id": "only-one"}]) == {"only-one": "only-one"}


def test_runaway_panel_lists_the_costliest_tasks_with_their_cost_in_every_run() -> None:
    runs = demo_like_runs()
    top = report_compare.runaways(runs, "class", top=3)
    assert [t.key for t in top] == ["b4", "t5", "b3"]  # 0.03, 0.01, 0.007 in the shadow run
    b4 = top[0]
    assert b4.group == "multi_hop"
    assert b4.cost_usd == {"shadow": pytest.approx(0.03), "enforced": pytest.approx(0.015)}
    assert b4.stopped == {"shadow": "would: max_cost_usd, max_steps", "enforced": "max_steps"}
    assert b4.correct == {"shadow": False, "enforced": False}
    with pytest.raises(report.ReportError, match="at least one"):
        report_compare.runaways(runs, "class", top=0)


def test_limits_are_drawn_only_for_groups_of_one_known_profile() -> None:
    runs = demo_like_runs()
    profiles = {"tight": {"max_cost_usd": 0.03, "max_retrieval_calls": 1}, "bounded": {"max_steps": 8}}
    # by class, every fixture class maps to one profile
    assert report_compare.group_limits(runs, "class", profiles) == {
        "simple_fact": {"max_cost_usd": 0.03, "max_retrieval_calls": 1.0},
        "procedural": {"max_cost_usd": 0.03, "max_retrieval_calls": 1.0},
        "multi_hop": {"max_steps": 8.0},
    }
    assert (
        report_compare.group_limits(runs, "route", profiles) == {}
    )  # "openai" holds tight and bounded tasks


def test_run_labels_are_file_stems_or_given() -> None:
    assert report_compare.run_labels(["d/shadow.jsonl", "d/enforced.jsonl"]) == ["shadow", "enforced"]
    assert report_compare.run_labels(["a/enforced.jsonl", "b/enforced.jsonl"]) == ["a/enforced", "b/enforced"]
    assert report_compare.run_labels(["x.jsonl", "y.jsonl"], ["before", "after"]) == ["before", "after"]
    with pytest.raises(report.ReportError, match="1 --label for 2"):
        report_compare.run_labels(["x.jsonl", "y.jsonl"], ["before"])


def test_table_of_several_runs_has_a_run_column_and_each_runs_numbers() -> None:
    runs = demo_like_runs()
    lines = report_compare.format_runs(runs, "table", "class").splitlines()
    assert lines[0].split()[:4] == ["run", "class", "tasks", "correct"]
    assert lines[2].split()[:3] == ["shadow", "multi_hop", "4"] and lines[6].split()[:2] == [
        "enforced",
        "multi_hop",
    ]
    assert len(lines) == 2 + 2 * 4
    as_json = orjson.loads(report_compare.format_runs(runs, "json", "class"))
    expected = [
        {"run": run.label, "by": "class", **row.as_dict()}
        for run in runs
        for row in report.summarize(run.records, "class")
    ]
    assert as_json == orjson.loads(orjson.dumps(expected))
    as_csv = report_compare.format_runs(runs, "csv", "class").splitlines()
    assert as_csv[0].startswith("run,by,group,tasks") and as_csv[5].startswith("enforced,class,multi_hop,4,")


# ---- the figure ----------------------------------------------------------------------------------


def drawn_texts(fig: Figure) -> list[tuple[str, Any]]:
    """Every text matplotlib draws, with its box in pixels (tick labels outside the view are not drawn)."""
    fig.canvas.draw()
    ticks, shown = set(), set()
    for ax in fig.axes:
        for axis, i in ((ax.xaxis, 0), (ax.yaxis, 1)):
            lo, hi = sorted(axis.get_view_interval())
            labels = axis.get_ticklabels(which="both")
            ticks.update(labels)
            shown.update(t for t in labels if lo - 1e-9 <= t.get_position()[i] <= hi + 1e-9)
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    return [
        (t.get_text(), t.get_window_extent(renderer))
        for t in fig.findobj(Text)
        if (t not in ticks or t in shown) and t.get_visible() and t.get_text().strip()
    ]


def assert_no_text_collides(fig: Figure) -> None:
    texts = drawn_texts(fig)
    width, height = fig.canvas.get_width_height()
    clashes = [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(texts, 2) if box_a.overlaps(box_b)]
    outside = [t for t, box in texts if box.x0 < 0 or box.y0 < 0 or box.x1 > width or box.y1 > height]
    assert (clashes, outside) == ([], [])
    assert len(texts) > 60  # titles, ticks, value labels, heat map cells, legend


def many_groups_run(label: str) -> report_compare.Run:
    recs = [
        report.parse_record(
            {
                "task_id": f"{label}-{i}",
                "class": f"customer_support_class_{i % 9}",
                "profile": "p",
                "cost_usd": 0.0001 * (i + 1),
                "retrieval_calls": i % 5,
                "rejections": {"max_steps": 1} if i % 3 == 0 else {},
                "outcome": {"correct": i % 4 != 0} if i % 7 else None,
            },
            "test",
        )
        for i in range(40)
    ]
    return report_compare.Run(label, recs)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["one run", "two runs", "three runs, nine long groups"])
def test_figure_text_never_overlaps(shape: str) -> None:
    runs = {
        "one run": [report_compare.Run("task_records", report.read_jsonl(str(FIXTURE)))],
        "two runs": demo_like_runs(),
        "three runs, nine long groups": [many_groups_run(n) for n in ("baseline", "tight-limits", "cache")],
    }[shape]
    fig = report_plot.figure(runs, "class", profiles={"tight": {"max_cost_usd": 0.03}}, top=8)
    assert_no_text_collides(fig)


@pytest.mark.slow
def test_png_shows_every_run_in_its_colour(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "cmp.png"
    report_plot.render(demo_like_runs(), "class", str(path))
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > 1200 and image.height > 900
    colours = pixels(path)
    assert colours[SHADOW_BLUE] > 5000 and colours[ENFORCED_ORANGE] > 5000  # bars of both runs
    one = tmp_path / "one.png"
    report_plot.render(demo_like_runs()[:1], "class", str(one))
    assert pixels(one)[SHADOW_BLUE] > 5000 and ENFORCED_ORANGE not in pixels(one)


def pixels(path: pathlib.Path) -> dict[tuple[int, int, int], int]:
    """Colour -> how many pixels have it."""
    with Image.open(path) as image:
        return {rgb: n for n, rgb in image.convert("RGB").getcolors(maxcolors=1 << 22) or []}


@pytest.mark.slow
def test_svg_and_pdf_by_extension_and_nothing_else(tmp_path: pathlib.Path) -> None:
    import xml.etree.ElementTree as ET

    report_plot.render(demo_like_runs(), "profile", str(tmp_path / "cmp.svg"))
    assert ET.parse(tmp_path / "cmp.svg").getroot().tag == "{http://www.w3.org/2000/svg}svg"
    report_plot.render(demo_like_runs(), "profile", str(tmp_path / "cmp.pdf"))
    assert (tmp_path / "cmp.pdf").read_bytes().startswith(b"%PDF-")
    with pytest.raises(report.ReportError, match=r"name a \.png, \.svg or \.pdf file"):
        report_plot.render(demo_like_runs(), "profile", str(tmp_path / "cmp.html"))


@pytest.mark.slow
def test_a_run_without_any_limit_hit_says_so() -> None:
    calm = [report_compare.Run("calm", [dict(r, rejections={}) for r in report.read_jsonl(str(FIXTURE))])]
    fig = report_plot.figure(calm, "class")
    texts = [t for t, _ in drawn_texts(fig)]
    assert "no call was refused by a limit, and none would have been (shadow)" in texts


# ---- the command line ----------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_compares_files_in_table_and_figure(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shadow, enforced = demo_like_runs()
    files = [write_jsonl(tmp_path / f"{run.label}.jsonl", list(run.records)) for run in (shadow, enforced)]
    plot = tmp_path / "cmp.png"
    assert main(["report", *files, "--by", "class", "--plot", str(plot), "--top", "3"]) == 0
    out, err = capsys.readouterr()
    assert out == report_compare.format_runs([shadow, enforced], "table", "class")
    assert f"wrote {plot}" in err
    with Image.open(plot) as image:
        assert image.format == "PNG"
    assert main(["report", *files, "--label", "before", "--label", "after", "--format", "json"]) == 0
    assert {row["run"] for row in orjson.loads(capsys.readouterr().out)} == {"before", "after"}
    assert main(["report", *files, "--label", "before"]) == 2
    assert capsys.readouterr().err == "ragtoll report: 1 --label for 2 record sources; give one per source\n"


@pytest.mark.slow
def test_cli_draws_the_limits_of_a_config(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "ragtoll.yaml"
    config.write_text(
        "budgets:\n  default_profile: tight\n  profiles:\n    tight: {max_cost_usd: 0.5}\n"
        "    bounded: {max_steps: 8}\n"
    )
    limits = tmp_path / "limits.png"
    assert (
        main(["report", str(FIXTURE), "--by", "class", "--config", str(config), "--plot", str(limits)]) == 0
    )
    plain = tmp_path / "plain.png"
    assert main(["report", str(FIXTURE), "--by", "class", "--plot", str(plain)]) == 0
    capsys.readouterr()
    # the tight classes' cost limit ($0.50) sets the cost axis, far above any task's cost ($0.03):
    # the cost bars shrink to a sliver
    assert pixels(limits)[SHADOW_BLUE] < pixels(plain)[SHADOW_BLUE] - 50_000
    fig = report_plot.figure(
        [report_compare.Run("r", report.read_jsonl(str(FIXTURE)))],
        "class",
        profiles={"tight": {"max_cost_usd": 0.5}},
    )
    assert fig.axes[0].get_ylim()[1] >= 0.5
    assert (
        main(["report", str(FIXTURE), "--config", str(tmp_path / "missing.yaml"), "--plot", str(limits)]) == 2
    )
    out, err = capsys.readouterr()
    assert "cannot be read" in err and out == ""  # the config is read before any table is printed


BLOCKED_MATPLOTLIB = """
import sys
sys.modules["matplotlib"] = None  # as if the plot extra were not installed
from ragtoll.proxy.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def test_plot_without_matplotlib_is_one_clear_line(tmp_path: pathlib.Path) -> None:
    plot = tmp_path / "report.png"
    for argv in (["report", str(FIXTURE), "--plot", str(plot)], ["demo", "--quick", "--plot", str(plot)]):
        proc = subprocess.run(
            [sys.executable, "-c", BLOCKED_MATPLOTLIB, *argv],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (
            f"ragtoll {argv[0]}: --plot needs matplotlib, from the plot extra (from a checkout: pip install -e '.[plot]')\n"
        )
        assert proc.stdout == "" and not plot.exists()  # checked before any table, demo run or file
    # without --plot the report needs no matplotlib
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKED_MATPLOTLIB, "report", str(FIXTURE)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("profile")


def economy_runs() -> list[report_compare.Run]:
    """The demo-like runs with the context numbers and groundedness a recent ragtoll records."""
    shadow, enforced = demo_like_runs()
    return [
        report_compare.Run(run.label, [
            dict(r, groundedness=None if i % 4 == 0 else (0.5 if run.label == "shadow" else 1.0),
                 context={"input_tokens": 1000, "cached_input_tokens": 400 if run.label == "shadow" else 900},
                 evidence={"resent_tokens": 5000 if run.label == "shadow" else 200})
            for i, r in enumerate(run.records)
        ])
        for run in (shadow, enforced)
    ]


def test_economy_panels_are_groundedness_cached_input_and_evidence_resent_per_group() -> None:
    runs = economy_runs()
    grounded = report_compare.means(runs, "class", "groundedness")
    assert grounded["shadow"] == {"multi_hop": 0.5, "procedural": 0.5, "simple_fact": 0.5}
    assert set(grounded["enforced"].values()) == {1.0}
    cached = report_compare.means(runs, "class", "cached_input_share")
    assert cached["shadow"]["simple_fact"] == pytest.approx(0.4) and cached["enforced"]["procedural"] == pytest.approx(0.9)
    assert report_compare.means(runs, "class", "evidence_tokens_resent")["enforced"]["multi_hop"] == 200
    titles = [ax.get_title() for ax in report_plot.figure(runs, "class").axes]
    assert any(t.startswith("Groundedness of the last answer") for t in titles)
    assert any(t.startswith("Evidence tokens resent per task") for t in titles)
    # records without these numbers: no such row, and no empty panels
    plain = [ax.get_title() for ax in report_plot.figure(demo_like_runs(), "class").axes]
    assert not any(t.startswith(("Groundedness", "Cached input", "Evidence tokens")) for t in plain)


@pytest.mark.slow
def test_economy_row_text_never_overlaps() -> None:
    assert_no_text_collides(report_plot.figure(economy_runs(), "class", profiles={"tight": {"max_cost_usd": 0.03}}))
