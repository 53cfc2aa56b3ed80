from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from tuner.core.errors import InputError
from tuner.serving.config import Deployment, ServeConfig
from tuner.study import (
    best_feasible_trial,
    closest_miss,
    count_finished,
    list_studies,
    load_study_by_name,
    miss_explanation,
    open_study,
    study_name,
    trial_config,
)
from tuner.study.storage import default_storage

DIST = {"x": CategoricalDistribution([0, 1, 2, 3, 4, 5])}


def _trial(x: int, value: float, *, feasible: bool, p95: float | None = None, state=TrialState.COMPLETE):
    attrs = {"config": ServeConfig(max_num_seqs=16 * (x + 1)).to_dict(), "feasible": feasible,
             "target_ttft_s": 2.0}
    if p95 is not None:
        attrs.update(p95_ttft_at_lowest_load_s=p95, lowest_load="1 users")
    if not feasible and p95 is None:
        attrs["infeasible_reason"] = "oom: CUDA out of memory"
    return create_trial(params={"x": x}, distributions=DIST, value=value if state == TrialState.COMPLETE else None,
                        user_attrs=attrs, state=state)


def test_study_name_is_stable_and_file_safe():
    dep = Deployment(model="/models/Qwen 7B/", gpu="V100-32GB-SXM2", gpu_count=8)
    name = study_name(dep, "0123456789abcdef", "my space")
    assert name == study_name(dep, "0123456789abcdef", "my space")
    assert name.startswith("8xV100-32GB-SXM2.Qwen_7B.my_space.01234567")
    assert "/" not in name and " " not in name
    assert study_name(dep, "fedcba9876543210", "my space") != name


def test_default_storage_creates_the_folder(tmp_path):
    url = default_storage("abc", tmp_path / "studies")
    assert (tmp_path / "studies").is_dir()
    assert url == f"sqlite:///{tmp_path}/studies/abc.db"


def test_best_feasible_ignores_infeasible_and_failed_trials(tmp_path):
    study = open_study("s", f"sqlite:///{tmp_path}/s.db")
    study.add_trial(_trial(0, 100.0, feasible=True))
    study.add_trial(_trial(1, 0.0, feasible=False, p95=3.0))
    study.add_trial(_trial(2, 300.0, feasible=True))
    study.add_trial(_trial(3, 0.0, feasible=False))
    study.add_trial(_trial(4, 0.0, feasible=True, state=TrialState.FAIL))
    best = best_feasible_trial(study)
    assert best.number == 2
    assert trial_config(best) == ServeConfig(max_num_seqs=48)
    assert count_finished(study) == 5


def test_closest_miss_is_the_smallest_overshoot(tmp_path):
    study = open_study("s", f"sqlite:///{tmp_path}/s.db")
    study.add_trial(_trial(0, 0.0, feasible=False))  # refused: never measured
    study.add_trial(_trial(1, 0.0, feasible=False, p95=5.0))
    study.add_trial(_trial(2, 0.0, feasible=False, p95=2.5))
    assert best_feasible_trial(study) is None
    miss = closest_miss(study)
    assert miss.number == 2
    text = miss_explanation(miss)
    assert "2.5 s" in text and "+0.5 s" in text and "+25%" in text


def test_closest_miss_falls_back_to_a_refusal(tmp_path):
    study = open_study("s", f"sqlite:///{tmp_path}/s.db")
    study.add_trial(_trial(0, 0.0, feasible=False))
    assert "oom" in miss_explanation(closest_miss(study))


def test_open_study_resumes_and_optuna_reads_it(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    open_study("s", url).add_trial(_trial(0, 1.0, feasible=True))
    assert len(open_study("s", url).trials) == 1
    assert len(optuna.load_study(study_name="s", storage=url).trials) == 1
    assert load_study_by_name("s", url).trials[0].value == 1.0
    [summary] = list_studies(url)
    assert (summary.name, summary.finished, summary.feasible, summary.best_value) == ("s", 1, 1, 1.0)


def test_load_unknown_study_lists_the_known_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    open_study("known", default_storage("known"))
    with pytest.raises(InputError, match="known"):
        load_study_by_name("nope")
    with pytest.raises(InputError, match="known"):
        load_study_by_name("nope", f"sqlite:///{tmp_path}/studies/known.db")
    assert [s.name for s in list_studies()] == ["known"]


def test_bad_storage_url_is_bad_input():
    with pytest.raises(InputError, match="storage"):
        open_study("s", "nosuchdriver://x/y")


def test_a_companion_is_no_study_of_its_own_and_goes_with_its_study(tmp_path):
    from tuner.study import confirmation_study, delete_study, list_studies, open_study, repeats

    url = f"sqlite:///{tmp_path}/s.db"
    st = open_study("main", url)
    assert confirmation_study(st) is None and repeats(st) == []
    companion = confirmation_study(st, create=True)
    companion.add_trial(create_trial(value=1.0, user_attrs={"confirm_of": 0, "confirm_round": 1}))
    open_study("other.confirm", url)  # named like a companion, of no study here: a study
    assert sorted(optuna.get_all_study_names(url)) == ["main", "main.confirm", "other.confirm"]
    assert [s.name for s in list_studies(url)] == ["main", "other.confirm"]
    again = optuna.load_study(study_name="main", storage=url)  # the link is the study's attr
    assert confirmation_study(again, storage=url).study_name == "main.confirm" and len(repeats(again, url)) == 1
    delete_study("main", url)
    assert optuna.get_all_study_names(url) == ["other.confirm"]


def test_a_study_opened_with_optuna_itself_finds_its_companion_on_the_storage_its_caller_passes(tmp_path):
    """Optuna gives a study no public handle to its storage: tuner's own openings keep it,
    and for a study opened with optuna the caller passes the URL or the storage."""
    from tuner.study import confirmation_study, open_study, repeats

    url = f"sqlite:///{tmp_path}/s.db"
    confirmation_study(open_study("main", url), create=True).add_trial(
        create_trial(value=1.0, user_attrs={"confirm_of": 0, "confirm_round": 1}))
    store = optuna.storages.RDBStorage(url)
    bare = optuna.load_study(study_name="main", storage=store)
    with pytest.raises(InputError, match="opened with optuna itself") as err:
        repeats(bare)
    assert "\n" not in str(err.value) and "storage=" in str(err.value)
    assert len(repeats(bare, url)) == 1
    assert confirmation_study(bare, storage=store).study_name == "main.confirm"
    assert len(repeats(bare)) == 1  # the storage passed once is the study's from then on
