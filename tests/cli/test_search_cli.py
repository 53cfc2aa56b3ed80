from __future__ import annotations

import json

import optuna
import pytest
import yaml
from cli_runner import run_cli

from tuner.cli.search import parse_gpus
from tuner.core.errors import InputError


def test_search_finds_a_feasible_config_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["search", "--budget", "2", "--output", "json"], capsys)
    assert code == 0
    report = json.loads(out)
    assert report["finished_trials"] == 2 and report["best"] is not None
    assert report["best"]["command"].startswith("vllm serve Qwen/Qwen2.5-7B-Instruct")
    assert report["best"]["ttft_p95_s"] <= report["target_ttft_s"]
    db = tmp_path / "studies" / f"{report['study']}.db"
    assert db.is_file()
    study = optuna.load_study(study_name=report["study"], storage=f"sqlite:///{db}")
    assert len([t for t in study.trials if "confirm_of" not in t.user_attrs]) == 2
    assert study.metric_names == ["tokens_per_s"]  # what optuna-dashboard calls the objective
    # the winner is confirmed on repeats: its band holds the mean, the repeats are stored
    conf = report["confirmation"]
    assert conf["winner"] == report["best"]["trial"] and conf["measurements"] == 3
    assert conf["band_tokens_per_s"][0] <= conf["mean_tokens_per_s"] <= conf["band_tokens_per_s"][1]
    assert conf["reason"].startswith(f"trial {conf['winner']}:")
    # the same job again tops the same study up
    code, out, _ = run_cli(["search", "--budget", "3", "--output", "json"], capsys)
    again = json.loads(out)
    assert code == 0 and again["study"] == report["study"]
    study = optuna.load_study(study_name=report["study"], storage=f"sqlite:///{db}")
    copies = sum(1 for t in study.trials if "repeat_of" in t.user_attrs)  # a copy takes no budget slot
    assert again["finished_trials"] == 3 and again["new_trials"] == 1 + copies
    code, out, _ = run_cli(["studies"], capsys)
    assert code == 0 and report["study"][:10] in out
    code, out, _ = run_cli(["studies", "show", report["study"], "--output", "json"], capsys)
    assert code == 0 and json.loads(out)["best"]["command"].startswith("vllm serve")


def test_text_output_prints_the_table_and_command(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["search", "--budget", "1", "--storage", f"sqlite:///{tmp_path}/x.db",
                            "--study", "mine", "--target-ttft", "3s"], capsys)
    assert code == 0
    assert "best feasible trial" in out and "vllm serve Qwen/Qwen2.5-7B-Instruct" in out
    assert optuna.load_study(study_name="mine", storage=f"sqlite:///{tmp_path}/x.db").user_attrs["target_ttft_s"] == 3.0


def test_no_feasible_config_exits_3_with_the_closest_miss(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["search", "--budget", "2", "--target-ttft", "1ms", "--output", "json"], capsys)
    assert code == 3
    assert json.loads(out)["best"] is None
    assert "no configuration met P95 TTFT <= 0.001 s" in err
    assert "came closest" in err


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--target-ttft", "soon"], "soon"),
        (["--gpus", "3-1"], "--gpus"),
        (["--sampler", "annealing"], "annealing"),
        (["--backend", "cloud"], "cloud"),
        (["--space", "no-such-space"], "no-such-space"),
        (["--budget", "0"], "budget"),
        (["--feasibility", "1.5"], "--feasibility must be a probability in (0, 1), got 1.5"),
        (["--gpu", "B9000"], "B9000"),
    ],
)
def test_bad_input_exits_2(tmp_path, monkeypatch, capsys, args, words):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["search", *args], capsys)
    assert code == 2
    assert words in err and err.startswith("tuner: ")


def test_bad_space_file_names_file_and_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    space = tmp_path / "mine.yaml"
    space.write_text("name: mine\nparameters:\n  max_num_seqs: {low: 64, high: 8}\n")
    code, _, err = run_cli(["search", "--space", str(space)], capsys)
    assert code == 2
    assert f"{space}:3: parameters.max_num_seqs" in err


def test_layout_that_does_not_fit_is_bad_input(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["search", "--space", "article-004-8xv100-32gb", "--gpus", "4"], capsys)
    assert code == 2
    assert "tp1x8 needs 8 GPUs" in err and "article-004-8xv100-32gb.yaml:" in err


def test_parse_gpus():
    assert parse_gpus("8") == (8, ())
    assert parse_gpus("0-3") == (4, (0, 1, 2, 3))
    assert parse_gpus("0,2-3") == (3, (0, 2, 3))
    for bad in ("0", "a", "1,1", "3-1"):
        with pytest.raises(InputError):
            parse_gpus(bad)


def test_every_option_has_help():
    import typer.main

    from tuner.cli import _register, app

    _register()
    main_group = typer.main.get_command(app)
    for name in ("search", "studies"):
        command = main_group.commands[name]
        assert command.help
        for param in command.params:
            assert getattr(param, "help", None), f"{name} {param.name} has no help"


def test_another_target_never_resumes_a_study_searched_for_the_first(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["search", "--budget", "1", "--target-ttft", "1ms", "--output", "json"], capsys)
    first = json.loads(out)["study"]
    code, out, _ = run_cli(["search", "--budget", "1", "--target-ttft", "2s", "--output", "json"], capsys)
    second = json.loads(out)
    # a derived name carries the target, so the 2 s search starts its own study
    assert code == 0 and second["study"] != first and second["finished_trials"] == 1
    # an explicit --study with another target is refused, not mixed
    code, _, err = run_cli(["search", "--budget", "2", "--study", first, "--target-ttft", "2s"], capsys)
    assert code == 2 and "searched for P95 TTFT <= 0.001 s, not 2 s" in err and "--target-ttft 0.001s" in err


def test_the_best_trial_speaks_vllm_bench_names_in_their_units(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["search", "--budget", "2", "--confirm", "0", "--output", "json"], capsys)
    assert code == 0, err
    best = json.loads(out)["best"]
    assert best["total_token_throughput"] == best["tokens_per_s"]
    assert best["output_throughput"] == best["output_tokens_per_s"]
    assert best["p95_ttft_ms"] == pytest.approx(best["ttft_p95_s"] * 1e3)
    users = int(best["load"].removesuffix(" users"))  # the default space offers concurrency
    assert best["max_concurrency"] == users and best["request_rate"] is None
    stats = ("mean", "median", "std", "p90", "p95", "p99")
    for metric in ("ttft", "tpot", "e2el"):
        for stat in stats:
            assert isinstance(best[f"{stat}_{metric}_ms"], float), f"{stat}_{metric}_ms"
    assert 1 < best["mean_tpot_ms"] < 1000 and best["median_ttft_ms"] <= best["p99_ttft_ms"]
    # the simulator keeps per-token times only for an ITL SLO: without one, ITL is null, not guessed
    assert all(best[f"{stat}_itl_ms"] is None for stat in stats)
    code, out, _ = run_cli(["studies", "show", json.loads(out)["study"], "--output", "json"], capsys)
    assert code == 0 and json.loads(out)["best"]["p95_ttft_ms"] == best["p95_ttft_ms"]
    code, out, err = run_cli(["search", "--budget", "1", "--confirm", "0", "--slo", "p95:itl<=1s", "-o", "json"],
                             capsys)
    best = json.loads(out)["best"]
    assert code == 0, err
    assert all(isinstance(best[f"{stat}_itl_ms"], float) for stat in stats)
    assert best["p95_itl_ms"] == pytest.approx(best["slos"]["p95:itl<=1s"]["measured_s"] * 1e3)


def test_pinned_knobs_are_fixed_not_searched(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["search", "--budget", "3", "--confirm", "0", "--max-num-seqs", "256",
                              "--set", "kv-cache-dtype=auto", "-o", "json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert "max_num_seqs_256" in report["study"]  # a pinned search is a study of its own
    study = optuna.load_study(study_name=report["study"], storage=report["storage"])
    assert study.trials and all("max_num_seqs" not in t.params and "kv_cache_dtype" not in t.params
                                for t in study.trials)
    assert {t.user_attrs["config"]["max_num_seqs"] for t in study.trials} == {256}
    assert {t.user_attrs["config"]["kv_cache_dtype"] for t in study.trials} == {"auto"}
    assert "--max-num-seqs 256" in report["best"]["command"]


@pytest.mark.parametrize("args, words", [
    (["--max-num-seqs", "0"], "--max-num-seqs: max_num_seqs must be an integer"),
    (["--set", "max_num_seqs=lots"], "--set max_num_seqs=lots: max_num_seqs takes int values, got 'lots'"),
    (["--set", "speed=11"], "--set speed=11: 'speed' is not a knob"),
    (["--set", "max_num_seqs"], "--set max_num_seqs: write knob=value"),
    (["--kv-cache-dtype", "fp4"], "--kv-cache-dtype: kv_cache_dtype 'fp4' is unknown"),
    (["--max-num-seqs", "64", "--set", "max-num-seqs=128"], "already pinned at 64 by --max-num-seqs"),
])
def test_a_bad_pin_is_one_line_saying_what_and_where(tmp_path, monkeypatch, capsys, args, words):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["search", "--budget", "1", *args], capsys)
    assert code == 2 and words in err and err.count("\n") == 1
    assert not (tmp_path / "studies").exists()  # refused before a study is made


@pytest.mark.parametrize("args, named, layout", [
    (["--tensor-parallel-size", "2"], "tensor_parallel_size_2", (2, 4)),
    (["--set", "replicas=2"], "replicas_2", (4, 2)),
])
def test_a_pinned_layout_half_keeps_only_the_space_layouts_with_it(tmp_path, monkeypatch, capsys, args, named, layout):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["search", "--space", "article-004-8xv100-32gb", "--budget", "2", "--confirm", "0",
                              *args, "--recipe", "win.json", "-o", "json"], capsys)  # layouts tp1x8, tp2x4, tp4x2
    assert code == 0, err
    report = json.loads(out)
    assert named in report["study"]  # a study of its own, like a pinned knob
    study = optuna.load_study(study_name=report["study"], storage=report["storage"])
    assert study.trials and all("layout" not in t.params for t in study.trials)  # one layout left: not searched
    assert {(t.user_attrs["config"]["tensor_parallel_size"], t.user_attrs["config"]["replicas"])
            for t in study.trials} == {layout}
    [entry] = json.loads((tmp_path / "win.json").read_text())
    assert entry["tensor_parallel_size"] == layout[0]


@pytest.mark.parametrize("args, words", [
    (["--space", "article-004-8xv100-32gb", "--tensor-parallel-size", "3"],
     "--tensor-parallel-size 3 leaves no layout: the space has tp1x8, tp2x4, tp4x2"),
    (["--gpus", "4", "--set", "tensor_parallel_size=8"],  # auto layouts: 4 GPUs, 28 heads
     "--set tensor_parallel_size=8 leaves no layout: the space has tp1x4, tp2x2, tp4x1 (auto: each TP that "
     "divides the 28 attention heads"),
    (["--gpus", "4", "--tensor-parallel-size", "2", "--replicas", "4"],
     "--tensor-parallel-size 2 --replicas 4 leaves no layout: the space has tp1x4, tp2x2, tp4x1"),
    (["--set", "replicas=none"], "--set replicas=none: replicas takes a whole number"),
    (["--tensor-parallel-size", "0"], "--tensor-parallel-size: tensor_parallel_size takes a whole number"),
])
def test_a_layout_pin_that_leaves_no_layout_is_one_line_naming_the_space_layouts(
        tmp_path, monkeypatch, capsys, args, words):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["search", "--budget", "1", *args], capsys)
    assert code == 2 and words in err and err.count("\n") == 1, err
    assert not (tmp_path / "studies").exists()  # refused before a study is made


def test_help_shows_the_layout_pins(capsys):
    code, out, _ = run_cli(["search", "--help"], capsys)
    assert code == 0 and "--tensor-parallel-size" in out and "--replicas" in out


def test_recipe_writes_the_recommendation_from_search_and_from_studies_show(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["search", "--budget", "2", "--confirm", "0", "--set", "kv_cache_dtype=fp8",
                              "--recipe", "out/win.json", "-o", "json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert "wrote out/win.json (serve-params) and out/win.sh (vllm serve command)" in err
    [entry] = json.loads((tmp_path / "out" / "win.json").read_text())
    assert entry["_benchmark_name"] == f"{report['study']}.trial{report['best']['trial']}"
    assert entry["kv_cache_dtype"] == "fp8" and entry["max_num_seqs"] == report["best"]["config"]["max_num_seqs"]
    assert (tmp_path / "out" / "win.sh").read_text().splitlines()[-1] == report["best"]["command"]
    assert report["best"]["output_notes"] and "accuracy" in report["best"]["output_notes"][0]
    code, out, err = run_cli(["studies", "show", report["study"], "--recipe", "again.yaml"], capsys)
    assert code == 0, err
    assert "note: --kv-cache-dtype fp8" in " ".join(out.split())  # the table's note, however it wraps
    assert (tmp_path / "again.sh").read_text().splitlines()[-1] == report["best"]["command"]
    assert yaml.safe_load((tmp_path / "again.yaml").read_text()) == [entry]
    code, _, err = run_cli(["studies", "show", report["study"], "--recipe", "win.txt"], capsys)
    assert code == 2 and "cannot tell the format" in err and err.count("\n") == 1


def test_the_study_holds_the_budget_its_companion_the_repeats_and_every_reader_recommends_one_trial(
        tmp_path, monkeypatch, capsys):
    import html

    from tuner.report.html import render_report
    from tuner.study import analysis

    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["search", "--budget", "2", "--output", "json"], capsys)
    assert code == 0
    report = json.loads(out)
    name, url = report["study"], f"sqlite:///{tmp_path}/studies/{report['study']}.db"
    # what optuna-dashboard and optuna.load_study see: the budget's trials, no repeat among them
    study = optuna.load_study(study_name=name, storage=url)
    assert report["copies"] == 0 and len(study.trials) == 2
    assert not any("confirm_of" in t.user_attrs for t in study.trials)
    assert study.user_attrs["confirmation_study"] == f"{name}.confirm"
    # the repeats: the companion's trials, in the same file, each of a trial of the study
    companion = optuna.load_study(study_name=f"{name}.confirm", storage=url)
    trial = report["best"]["trial"]
    conf = report["confirmation"]
    assert {t.user_attrs["confirm_of"] for t in companion.trials} <= {t.number for t in study.trials}
    assert sum(t.user_attrs["confirm_of"] == trial for t in companion.trials) == conf["measurements"] - 1
    # one recommended trial and one confirmed figure, whoever reads the study
    said = report["recommendation"]
    assert said["trial"] == trial == conf["winner"] and said["mean"] == conf["mean_tokens_per_s"]
    assert said["measurements"] == conf["measurements"] >= 2 and said["mean"] != said["value"]
    code, out, _ = run_cli(["studies", "show", name, "--output", "json"], capsys)
    shown = json.loads(out)
    assert code == 0 and shown["best"]["trial"] == trial and shown["recommendation"] == said
    assert shown["confirmation"]["winner"] == trial and shown["confirmation_repeats"] == len(companion.trials)
    code, out, _ = run_cli(["studies"], capsys)
    assert code == 0 and f"#{trial}" in out and ".confirm" not in out  # the companion is not a study of its own
    opened = analysis.open_study(tmp_path / "studies" / f"{name}.db")  # tuner.open_study: a file of two studies
    assert opened.study_name == name
    trials = analysis.trials_frame(opened)
    frame = trials.frame
    assert len(trials) == len(frame) == 2 and trials.recommended == trial
    assert frame.loc[frame["recommended"], "number"].tolist() == [trial]
    assert analysis.recommendation(opened).to_dict() == said and analysis.best_trial(opened).number == trial
    page, _ = render_report(opened)
    assert f"recommended trial #{trial}" in page and f"{said['mean']:,.0f} tok/s mean of {said['measurements']}" in page
    assert "2 trials (" in page and f"; {len(companion.trials)} confirmation repeats outside them" in page
    assert html.escape(conf["reason"][1:]) in page


@pytest.mark.parametrize("command", [["search", "--budget", "1"], ["nightly", "--trials", "1"],
                                     ["plan", "--gpu", "L4", "--model", "qwen2.5-7b", "--target-ttft", "1s"],
                                     ["estimate", "-c", "1"]])
def test_a_missing_trace_is_blamed_on_the_flag_that_named_it(tmp_path, monkeypatch, capsys, command):
    """--trace came from the command line: the message names it and the file, not the search
    space's workload.trace line nor the space folder's rule for relative paths."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli([*command, "--trace", "missing.jsonl"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "'--trace'" in err and "missing.jsonl" in err and "no such file" in err
    assert "default.yaml" not in err and "space file" not in err and "workload.trace" not in err
    assert not (tmp_path / "studies").exists() or not any((tmp_path / "studies").iterdir())  # nothing begun


def test_a_trace_given_to_the_library_is_not_blamed_on_the_space(tmp_path):
    from tuner.space import load_space

    space = load_space("default", trace=str(tmp_path / "missing.jsonl"))  # the space's own is not checked
    assert space.workload.trace.endswith("missing.jsonl")
    with pytest.raises(InputError) as caught:
        import tuner

        tuner.search(workload={"trace": str(tmp_path / "missing.jsonl")}, settings=None)
    assert "missing.jsonl" in str(caught.value) and "default.yaml" not in str(caught.value)


def test_a_layout_that_leaves_a_gpu_idle_says_which_one(tmp_path, monkeypatch, capsys):
    """--gpus 3 --tensor-parallel-size 2 can only run TP2 x 1: the run goes on (three GPUs are
    what the host has) and one line says that GPU 2 sits idle, live and in the report."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["search", "--budget", "1", "--confirm", "0", "--gpus", "3",
                              "--tensor-parallel-size", "2", "--output", "json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    said = [n for n in report["notes"] if "idle" in n]
    assert len(said) == 1 and "GPU 2 sits idle" in said[0] and "2 of the 3 GPUs (0,1)" in said[0], report["notes"]
    assert err.count("GPU 2 sits idle") == 1  # said once, as the run starts
    code, out, err = run_cli(["search", "--budget", "1", "--confirm", "0", "--gpus", "1,4,6",
                              "--tensor-parallel-size", "2", "--output", "json"], capsys)
    assert code == 0 and any("GPU 6 sits idle" in n for n in json.loads(out)["notes"]), out


def test_the_winner_says_so_exactly_when_its_layout_leaves_a_gpu_idle(tmp_path, monkeypatch, capsys):
    """On 3 GPUs the auto layouts are TP1 x 3 (all used) and TP2 x 1 (GPU 2 idle): nothing is said
    as the run starts, and the report's note names the idle GPU iff the winner is the latter."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["search", "--budget", "3", "--confirm", "0", "--gpus", "3", "--output", "json"], capsys)
    assert code == 0 and "idle" not in err, err
    report = json.loads(out)
    best = report["best"]["config"]
    fills = best["tensor_parallel_size"] * best["replicas"] == 3
    said = [n for n in report["notes"] if "idle" in n]
    assert said == ([] if fills else [said[0]]) and (fills or said[0].startswith("the winner, TP2 x 1 replica"))
    code, out, err = run_cli(["search", "--budget", "1", "--confirm", "0", "--gpus", "4",
                              "--tensor-parallel-size", "2", "--output", "json"], capsys)
    assert code == 0 and not [n for n in json.loads(out)["notes"] if "idle" in n] and "idle" not in err


def test_a_deployment_names_the_devices_a_layout_leaves_idle():
    from tuner.serving.config import Deployment

    dep = Deployment(gpu_count=3)
    assert dep.idle_devices(1, 3) == () and dep.idle_devices(2, 1) == (2,) and dep.idle_devices(1, 1) == (1, 2)
    assert "GPUs 1,2 sit idle" in dep.idle_note(1, 1) and dep.idle_note(1, 3) is None
    assert Deployment(gpu_count=3, gpu_ids=(1, 4, 6)).idle_devices(2, 1) == (6,)


def test_estimate_and_plan_say_the_idle_gpu_as_search_does(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["estimate", "--gpus", "3", "--tensor-parallel-size", "2"], capsys)
    assert code == 0 and "note: TP2 x 1 replica uses 2 of the 3 GPUs (0,1), GPU 2 sits idle" in out
    code, out, _ = run_cli(["estimate", "--gpus", "3", "--tensor-parallel-size", "2", "-o", "json"], capsys)
    assert code == 0 and json.loads(out)["idle_gpus"] == [2]
    code, out, _ = run_cli(["estimate", "--gpus", "2", "--tensor-parallel-size", "2", "-o", "json"], capsys)
    assert code == 0 and json.loads(out)["idle_gpus"] == []
    code, out, _ = run_cli(["plan", "--gpus", "3", "--tensor-parallel-size", "2", "--target-ttft", "2s", "-c", "2,4",
                            "-n", "40", "--no-files", "--no-store", "-o", "json"], capsys)
    assert code == 0 and "TP2 x 1 replica uses 2 of the 3 GPUs (0,1), GPU 2 sits idle" in json.loads(out)["notes"]


def test_timeout_does_what_search_help_says(tmp_path, monkeypatch, capsys):
    """--help said --timeout 'exits normally' and listed exit 124 for it: it prints the best so
    far as a finished run does and exits 124 while trials of the budget are left, 0 once none is."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    _, text, _ = run_cli(["search", "--help"], capsys)
    text = " ".join(text.split())
    assert "exits normally" not in text
    assert "124 --timeout ended the run before the budget was used" in text
    assert "--timeout stops one still running at the limit" in text and "exits 124 while" in text
    # budget 400 in 10 s: a window that holds a trial (a 2 s one, on a busy machine, is refused: not even 200
    # requests replay 5 times in half of it) and not the budget (a trial takes 0.1 s at the very least)
    code, out, err = run_cli(["search", "--budget", "400", "--timeout", "10", "--study", "t", "-o", "json"], capsys)
    report = json.loads(out)  # the report is printed, as a finished run prints it
    assert code == 124 and report["timed_out"] and report["finished_trials"] < 400, err
    code, out, _ = run_cli(["search", "--budget", str(max(report["finished_trials"], 1)), "--study", "t",
                            "--timeout", "1h", "-o", "json"], capsys)
    assert code == 0 and not json.loads(out)["timed_out"]  # the budget used within the window: a normal exit
