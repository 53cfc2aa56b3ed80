"""Tables at 80 columns: labels and headers wrap, values are never cut."""
from __future__ import annotations

import json
import re

import pytest
from cli_runner import run_cli
from rich.console import Console

from tuner.cli.output import fit, table

LONG = "1xH100-SXM.qwen2.5-7b.default.10e707e7.ttft2s"


@pytest.mark.parametrize("width", [80, 60])
def test_values_keep_their_width_and_labels_wrap(width):
    out = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    tbl = table("studies")
    tbl.add_column("study")
    for header in ("trials", "feasible", "best tok/s", "best trial"):
        tbl.add_column(header, justify="right")
    tbl.add_row(LONG, "1,048", "1,040", "26,497", "#17")
    out.print(fit(tbl, out))
    text = out.export_text()
    assert all(len(line) <= width for line in text.splitlines())
    assert "…" not in text
    for value in ("1,048", "1,040", "26,497", "#17"):
        assert re.search(rf"(?<![\d,]){re.escape(value)}(?![\d,])", text), f"{value} was cut: {text}"
    body = text.split("─" * 10, 1)[1].split("\n", 1)[1]
    assert "".join(line.split()[0] for line in body.splitlines() if line.strip()) == LONG  # wrapped, whole


def test_a_key_value_table_wraps_its_labels_before_its_values():
    out = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    tbl = table("capacity", header=False)
    tbl.add_column("")
    tbl.add_column("", justify="right")
    tbl.add_row("replicas", "1 for 3,000 conversations/min (+20% headroom, 1 GPU each)")
    tbl.add_row("cost per hour", "2.50 per deployment (1 GPUs x 2.5), 2.50 for all replicas")
    out.print(fit(tbl, out))
    text = out.export_text()
    assert "2.50 per deployment (1 GPUs x 2.5), 2.50 for all replicas" in text  # one line
    assert all(len(line) <= 80 for line in text.splitlines())


@pytest.mark.slow
def test_search_studies_and_show_fit_80_columns(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli(["search", "--budget", "2", "--output", "json"], capsys)
    report = json.loads(out)
    assert code == 0
    best = f"{report['best']['tokens_per_s']:,.0f}"
    code, text, _ = run_cli(["search", "--budget", "2"], capsys)
    code2, listing, _ = run_cli(["studies"], capsys)
    code3, shown, _ = run_cli(["studies", "show", report["study"]], capsys)
    assert code == code2 == code3 == 0
    for output in (text, listing, shown):
        lines = [x for x in output.splitlines() if not x.startswith("vllm serve ")]  # the command stays whole
        assert all(len(x) <= 80 for x in lines), output
        assert "…" not in output and best in output
    assert report["study"] in listing and "{" not in shown  # a table, not a Python dict
    row = next(x for x in listing.splitlines() if x.startswith(report["study"]))
    assert row.split()[1] == "2"  # the finished trials search counts (its confirmation repeats aside)
    assert f"best feasible trial #{report['best']['trial']}" in shown and "P95 TTFT <= 2 s" in shown
    assert report["best"]["command"] in shown.splitlines()


@pytest.mark.slow
def test_a_plan_with_slos_keeps_each_loads_limit_on_its_row_at_80_columns(tmp_path, monkeypatch, capsys):
    """The sweep of a study with an SLO beside P95 TTFT names the SLO that limits each load; at
    80 columns that cell wrapped over three rows ('P99' / 'TPOT' / '22%') under every load."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    code, _, _ = run_cli(["search", "--budget", "3", "--confirm", "0", "--target-ttft", "2s",
                          "--slo", "p99:tpot<=30ms"], capsys)
    assert code == 0
    code, text, _ = run_cli(["plan", "--no-files", "-c", "5,20"], capsys)
    assert code == 0
    rows = [line for line in text.splitlines() if re.match(r"\s+\d+\s+\d", line)]
    assert rows and all(re.search(r"P99 TPOT \d+%", line) for line in rows), text
    assert all(len(line) <= 80 for line in text.splitlines() if not line.startswith("vllm serve "))
    assert "under other SLOs" not in " ".join(text.split())  # the study's own SLOs, the TTFT one among them
