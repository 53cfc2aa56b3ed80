from __future__ import annotations

import json

import optuna
import pytest
from cli_runner import run_cli

CONFIG = ["--gpu", "H100-SXM", "--model", "qwen2.5-7b", "--max-num-seqs", "64", "--max-model-len", "4096"]
KEYS = ("max_concurrency", "requests_per_s", "tokens_per_s", "output_tokens_per_s", "conversations_per_min",
        "replicas", "sweep")


def test_no_study_is_a_clear_bad_input(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["plan", "--target-ttft", "5s"], capsys)
    assert code == 2
    assert "no study in studies/" in err and "tuner search" in err


def test_no_feasible_trial_exits_3(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "studies").mkdir()
    optuna.create_study(study_name="empty", storage=f"sqlite:///{tmp_path}/studies/empty.db")
    code, _, err = run_cli(["plan", "--target-ttft", "5s"], capsys)
    assert code == 3 and "'empty' has no feasible trial" in err
    # the newest file holds a study of another name (tuner search --storage ... --study mine)
    optuna.create_study(study_name="mine", storage=f"sqlite:///{tmp_path}/studies/other.db")
    code, _, err = run_cli(["plan", "--target-ttft", "5s"], capsys)
    assert code == 3 and "'mine' has no feasible trial" in err


def test_config_on_the_command_line_json_and_files(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["plan", *CONFIG, "--target-ttft", "1s", "-c", "4,16", "-n", "120",
                            "--demand", "600/min", "--gpu-hour-cost", "3", "--output", "json",
                            "--out", str(tmp_path / "o")], capsys)
    assert code == 0
    data = json.loads(out)
    for key in KEYS:
        assert key in data
    assert data["ttft_p95_s"] <= 1.0 and data["replicas"] >= 1 and data["study"] is None
    assert data["cost_per_hour"] == 3.0  # one GPU
    assert [f.rsplit("/", 1)[-1] for f in data["files"]] == ["plan-1s.md", "plan-1s.png"]
    assert (tmp_path / "o" / "plan-1s.png").is_file()


def test_plan_from_the_newest_study_is_stored_and_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["search", "--budget", "1", "--target-ttft", "2s", "--output", "json"], capsys)
    assert code == 0
    name = json.loads(out)["study"]
    code, out, _ = run_cli(["plan", "-c", "2,8", "-n", "100", "--tokens-per-conversation", "300"], capsys)
    assert code == 0
    assert "load sweep" in out and "conversations/min" in out and "300 tokens/conversation" in out
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/studies/{name}.db")
    assert any(k.startswith("plan/") and k.endswith("ttft-2s") for k in study.user_attrs)  # the study's own target
    assert list((tmp_path / "studies" / name).glob("plan-2s*.md"))
    # the study's synthetic mix with -n 100 requests: another sample of it, said so
    (stored,) = [v for k, v in study.user_attrs.items() if k.startswith("plan/")]
    assert stored["workload"]["match"] == "same-mix" and stored["workload"]["requests"] == 100
    assert any("sample of the distribution the study searched on" in n for n in stored["notes"])
    assert "workload: article-004-mix" in out


@pytest.mark.parametrize("argv, message", [
    (["plan", "--study", "x", "--tensor-parallel-size", "2"], "--tensor-parallel-size describes a configuration"),
    (["plan", *CONFIG, "--demand", "lots"], "cannot read demand"),
    (["plan", *CONFIG, "--output", "yaml"], "'yaml' is not one of 'text', 'json'"),
    (["plan", *CONFIG, "--headroom", "much"], "cannot read --headroom"),
])
def test_bad_flags_exit_2(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and message in err


def test_every_plan_option_has_help():
    import typer.main

    from tuner.cli import _register, app

    _register()
    command = typer.main.get_command(app).commands["plan"]
    assert command.help and "target" in command.help
    trace = next(p for p in command.params if p.name == "trace")
    assert "instead of the study's workload" in trace.help and "warning" in trace.help
    for param in command.params:
        assert getattr(param, "help", None), f"plan {param.name} has no help"


def test_configuration_flags_beside_a_study_say_they_do_not_plan_its_best(tmp_path, monkeypatch, capsys):
    """`tuner plan --gpus 8` where a study sits in studies/ plans vLLM's defaults on 8 GPUs, not the study's
    winner (--gpus is one of the flags that describe a configuration): one warning line says so and how to
    plan the study instead; with no study there is nothing to point at."""
    monkeypatch.chdir(tmp_path)
    plan = ["plan", "--gpus", "2", "-c", "5", "--no-files", "--no-store", "--output", "json"]
    code, _, err = run_cli(plan, capsys)
    assert code == 0 and "warning" not in err
    code, out, _ = run_cli(["search", "--budget", "1", "--study", "mine", "--output", "json"], capsys)
    assert code == 0, out
    code, out, err = run_cli(plan, capsys)
    lines = [ln for ln in err.splitlines() if "warning" in ln]
    assert code == 0 and len(lines) == 1 and "--gpus describes a configuration given here" in lines[0], err
    assert "give --study mine without --gpus" in lines[0]
    assert json.loads(out)["trial"] is None  # what was planned is the configuration given here
