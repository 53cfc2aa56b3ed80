"""``tuner studies`` and ``tuner studies show`` give one trial count for a study (the trials
``--budget`` counts) and say what each other number counts: a study where the sampler met
its few configurations again holds many copies, which take no budget slot."""
from __future__ import annotations

import json

import optuna
import pytest
from cli_runner import run_cli

# every knob pinned but prefix caching: two configurations, so the sampler proposes copies
PINS = ["--gpu-memory-utilization", "0.9", "--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
        "--max-model-len", "8192", "--block-size", "16", "--set", "enforce_eager=false",
        "--set", "kv_cache_dtype=auto", "--confirm", "0"]


@pytest.fixture
def copied(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")  # one table row a line
    code, out, err = run_cli(["search", "--budget", "4", "--study", "few", *PINS, "--output", "json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    trials = optuna.load_study(study_name="few", storage="sqlite:///studies/few.db").trials
    assert len(trials) > report["finished_trials"] == 4  # copies were made: the case that disagreed
    return report, len(trials)


def test_studies_and_studies_show_give_the_same_trial_count_and_say_what_it_counts(copied, capsys):
    report, stored = copied
    code, out, _ = run_cli(["studies"], capsys)
    row = next(line for line in out.splitlines() if line.startswith("few "))
    assert code == 0 and row.split()[1] == "4", out
    assert "as --budget counts them" in " ".join(out.split())
    code, out, _ = run_cli(["studies", "show", "few"], capsys)
    shown = " ".join(out.split())
    assert code == 0 and "trials 4 as --budget counts them" in shown, out
    copies = stored - 4
    assert f"{copies} copies of a configuration measured before" in shown and f"{stored} complete" in shown
    code, out, _ = run_cli(["studies", "show", "few", "-o", "json"], capsys)
    info = json.loads(out)
    assert info["budget_trials"] == 4 and info["free_copies"] == copies and info["trials"]["COMPLETE"] == stored
