"""`tuner plan` replays the requests its study searched on: a study searched on a file
written by `tuner trace convert` is planned on that file, never on the log recorded
inside it; a file that no longer holds the study's requests is refused (exit 2, one
line) unless --trace asks for it on purpose (one warning line, the plan runs)."""
from __future__ import annotations

import json
from pathlib import Path

import optuna
from cli_runner import run_cli
from trace_data import AZURE_CONV as AZURE

from tuner.plan import load_plan
from tuner.search import run_search
from tuner.space import load_space
from tuner.study import best_feasible_trial

LOG_ROWS = 300  # the "original log": the first 300 requests of the Azure conversation trace
SAMPLE = 60  # the converted file the study searches on: 60 of them

SPACE = """\
name: converted-trace
deployment: {{model: qwen2.5-7b, gpu: H100-SXM, gpus: 1}}
workload: {{target_ttft_s: 2s, trace: {trace}}}
parameters:
  max_num_seqs: 32
  max_model_len: 2048
layouts: [tp1x1]
"""


def converted_study(folder: Path, capsys) -> tuple[Path, Path, str]:
    """(original log, converted file, storage URL) of a one-trial simulator study
    searched on ``SAMPLE`` requests converted from a ``LOG_ROWS``-request log."""
    with AZURE.open(encoding="utf-8") as f:
        head = [next(f) for _ in range(LOG_ROWS + 1)]
    log = folder / "azure-excerpt.csv"  # a real log of its own, in the test's folder
    log.write_text("".join(head), encoding="utf-8")
    conv = folder / "sampled.jsonl"
    code, _, err = run_cli(["trace", "convert", str(log), str(conv), "--sample", str(SAMPLE),
                            "--max-model-len", "2048"], capsys)
    assert code == 0, err
    path = folder / "space.yaml"
    path.write_text(SPACE.format(trace=conv), encoding="utf-8")
    space = load_space(str(path))
    storage = f"sqlite:///{folder}/s.db"
    out = run_search(space.bind(space.deployment, num_heads=28), budget=1, storage=storage, study="s")
    assert out.best is not None
    return log, conv, storage


def plan_json(capsys, storage: str, *extra: str) -> tuple[int, dict | None, str]:
    code, out, err = run_cli(["plan", "--study", "s", "--storage", storage, "-c", "2,8",
                              "--output", "json", "--no-files", *extra], capsys)
    return code, json.loads(out) if code == 0 else None, err


def test_a_study_on_a_converted_trace_is_planned_on_that_file_not_the_log_inside_it(tmp_path, capsys):
    log, conv, storage = converted_study(tmp_path, capsys)
    trial = best_feasible_trial(optuna.load_study(study_name="s", storage=storage))
    run = trial.user_attrs["run"]
    assert run["workload_requests"] == SAMPLE and run["workload_source"] == str(conv)
    code, data, err = plan_json(capsys, storage)
    assert code == 0, err
    assert "warning" not in err
    replayed = data["workload"]
    assert replayed["requests"] == SAMPLE and replayed["fingerprint"] == run["workload_fingerprint"]
    assert replayed["file"] == str(conv.resolve()) and replayed["source"] == str(conv)
    assert replayed["match"] == "same" and replayed["matches_study"]
    assert {p["requests"] for p in data["sweep"]} == {SAMPLE}  # every run replayed the study's 60, not the log's 300
    stored = load_plan("s", storage=storage)
    assert stored.workload.fingerprint == run["workload_fingerprint"] and stored.workload.matches_study
    # --num-requests: the first rows of the same file, a subset on purpose, and the notes say so
    code, data, err = plan_json(capsys, storage, "-n", "40", "--no-store")
    assert code == 0 and "warning" not in err
    assert data["workload"]["requests"] == 40 and data["workload"]["match"] == "first-rows"
    assert any(f"first 40 of the study's {SAMPLE} requests" in n for n in data["notes"])


def test_a_study_made_before_the_file_was_recorded_finds_the_file_not_the_log(tmp_path, capsys):
    """Studies from before ``workload_file`` name the converted file's recorded log as
    their source (the bug): plan tries it, finds other requests, and takes the space's
    trace, whose requests are the study's."""
    log, conv, storage = converted_study(tmp_path, capsys)
    study = optuna.load_study(study_name="s", storage=storage)
    best = best_feasible_trial(study)
    run = {k: v for k, v in best.user_attrs["run"].items() if k != "workload_file"}
    run["workload_source"] = str(log)
    old = optuna.create_study(study_name="old", storage=storage, directions=study.directions)
    for key, value in study.user_attrs.items():
        old.set_user_attr(key, value)
    old.add_trial(optuna.trial.create_trial(params=best.params, distributions=best.distributions, values=best.values,
                                            user_attrs={**best.user_attrs, "run": run}))
    code, out, err = run_cli(["plan", "--study", "old", "--storage", storage, "-c", "2,8", "--output", "json",
                              "--no-files", "--no-store"], capsys)
    assert code == 0, err
    replayed = json.loads(out)["workload"]
    assert replayed["requests"] == SAMPLE and replayed["file"] == str(conv.resolve()) and replayed["matches_study"]


def test_a_file_that_changed_is_refused_unless_trace_asks_for_it(tmp_path, capsys):
    log, conv, storage = converted_study(tmp_path, capsys)
    studied = best_feasible_trial(optuna.load_study(study_name="s", storage=storage)).user_attrs["run"][
        "workload_fingerprint"]
    # the same path now holds another sample of the log
    code, _, err = run_cli(["trace", "convert", str(log), str(conv), "--sample", "80", "--seed", "1",
                            "--max-model-len", "2048"], capsys)
    assert code == 0, err
    code, _, err = plan_json(capsys, storage)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert f"searched on {SAMPLE} requests (fingerprint {studied})" in err and "80 requests" in err
    assert "--trace FILE" in err
    code, data, err = plan_json(capsys, storage, "--trace", str(conv))
    assert code == 0
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and studied in warnings[0] and data["workload"]["fingerprint"] in warnings[0]
    assert data["workload"]["requests"] == 80 and data["workload"]["match"] == "other"
    assert data["workload"]["study_fingerprint"] == studied and not data["workload"]["matches_study"]
