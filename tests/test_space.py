from __future__ import annotations

import re
import textwrap

import optuna
import pytest

from tuner.core.errors import InputError
from tuner.core.units import parse_seconds
from tuner.serving.config import Deployment, ServeConfig
from tuner.space import list_spaces, load_space, parse_layout, parse_space

GOOD = textwrap.dedent(
    """\
    name: tiny
    deployment:
      model: qwen2.5-7b
      gpu: V100-32GB-SXM2
      gpus: 8
    workload:
      target_ttft_s: 500ms
      requests: 50
    parameters:
      gpu_memory_utilization: {low: 0.8, high: 0.9, step: 0.05}
      max_num_seqs: {low: 16, high: 256, log: true}
      block_size: 16
      kv_cache_dtype: {choices: [auto, fp8]}
    layouts: [tp1x8, tp2x4]
    """
)


def _error(text: str) -> InputError:
    with pytest.raises(InputError) as info:
        parse_space(text, path="my.yaml")
    return info.value


def test_parse_reads_ranges_choices_fixed_and_workload():
    space = parse_space(GOOD, path="my.yaml")
    assert space.name == "tiny"
    assert space.deployment.gpu_count == 8
    assert space.workload.target_ttft_s == pytest.approx(0.5)
    assert dict(space.fixed) == {"block_size": 16}
    assert {p.name for p in space.params} == {"gpu_memory_utilization", "max_num_seqs", "kv_cache_dtype"}
    assert space.layouts == ((1, 8), (2, 4))


def test_suggested_configs_stay_inside_the_space():
    space = parse_space(GOOD, path="my.yaml").bind(Deployment(gpu_count=8), num_heads=28)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    flags = set()
    seen_layouts = set()
    for _ in range(30):
        trial = study.ask()
        config = space.suggest(trial)
        assert isinstance(config, ServeConfig)
        assert 0.8 <= config.gpu_memory_utilization <= 0.9
        assert 16 <= config.max_num_seqs <= 256
        assert config.block_size == 16
        assert config.gpus_needed <= 8
        seen_layouts.add((config.tensor_parallel_size, config.replicas))
        flags.add(str(config.gpu_memory_utilization))
        # the config maps back onto the same trial params
        assert space.params_of(config) == pytest.approx(trial.params)
        assert space.config_from_params(trial.params) == config
        study.tell(trial, 1.0)
    assert seen_layouts == {(1, 8), (2, 4)}
    assert flags == {"0.8", "0.85", "0.9"}  # step values print as the flag a user would type


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("parameters:\n  max_num_seqz: 8\n", 2, "max_num_seqz"),
        ("parameters:\n  max_num_seqs: {low: 64, high: 8}\n", 2, "below high"),
        ("parameters:\n  max_num_seqs: [8, 16]\n", 2, "choices"),
        ("parameters:\n  kv_cache_dtype: {choices: [auto, int3]}\n", 2, "kv_cache_dtype"),
        ("parameters:\n  gpu_memory_utilization: {low: 0.5, high: 1.5}\n", 2, "gpu_memory_utilization"),
        ("parameters:\n  enforce_eager: {low: 0, high: 1}\n", 2, "choices"),
        ("workload:\n  target_ttft_s: soon\n", 2, "soon"),
        ("workload:\n  load: burst\n", 2, "burst"),
        ("layouts: [tp2x4, 2x4]\n", 1, "2x4"),
        ("name: x\nfoo: 1\n", 2, "foo"),
        ("deployment:\n  gpus: 0\n", 2, "deployment.gpus"),
        ("parameters: {max_num_seqs: {low: 1, high: 4\n", None, "YAML"),
    ],
)
def test_validation_names_file_line_and_key(text, line, words):
    err = _error(text)
    assert err.path == "my.yaml"
    if line is not None:
        assert err.line == line
    assert words in str(err)
    assert str(err).startswith("my.yaml:")


def test_bad_yaml_reports_its_line():
    err = _error("name: x\nparameters:\n  max_num_seqs: {low: 1, high: 4\n")
    assert err.line is not None and err.line >= 3


def test_layout_must_fit_the_gpus():
    space = parse_space("layouts: [tp2x4, tp4x4]\n", path="my.yaml")
    with pytest.raises(InputError) as info:
        space.bind(Deployment(gpu_count=8), num_heads=32)
    assert "tp4x4" in str(info.value) and "16 GPUs" in str(info.value)
    assert info.value.line == 1 and info.value.path == "my.yaml"


def test_layout_tp_must_divide_the_heads():
    space = parse_space("layouts: [tp1x8, tp8x1]\n", path="my.yaml")
    with pytest.raises(InputError, match="does not divide the 28 attention heads"):
        space.bind(Deployment(gpu_count=8), num_heads=28)


def test_auto_layouts_fill_the_gpus_with_dividing_tp():
    space = parse_space("layouts: auto\n", path="my.yaml")
    bound = space.bind(Deployment(gpu_count=8), num_heads=28)
    assert bound.layouts == ((1, 8), (2, 4), (4, 2))  # 28 heads: TP 8 does not divide them
    assert space.bind(Deployment(gpu_count=1), num_heads=28).layouts == ((1, 1),)


def test_grid_is_the_discretised_space():
    space = parse_space(GOOD, path="my.yaml").bind(Deployment(gpu_count=8), num_heads=28)
    grid = space.grid(points=4)
    assert grid["gpu_memory_utilization"] == [0.8, 0.85, 0.9]
    seqs = grid["max_num_seqs"]
    assert seqs[0] == 16 and seqs[-1] == 256 and len(seqs) == 4 and seqs == sorted(seqs)
    assert grid["layout"] == ["tp1x8", "tp2x4"]
    assert "block_size" not in grid  # fixed knobs are not searched


@pytest.mark.parametrize(("text", "seconds"), [("5s", 5.0), ("500ms", 0.5), ("5", 5.0), (2, 2.0), ("1.5 s", 1.5), ("2m", 120.0), ("24h", 86400.0)])  # noqa: E501
def test_parse_seconds(text, seconds):
    assert parse_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0", "-1s", "fast", "5y", True])
def test_parse_seconds_rejects(text):
    with pytest.raises(InputError):
        parse_seconds(text)


def test_parse_layout():
    assert parse_layout("tp2x4") == (2, 4)
    with pytest.raises(InputError, match="tp<TP>x<replicas>"):
        parse_layout("tp0x4")


def test_shipped_spaces_parse():
    names = {p.stem for p in list_spaces()}
    assert {"default", "article-000-v100-16gb", "article-004-8xv100-32gb"} <= names
    for name in names:
        space = load_space(name)
        assert space.params, name
        assert space.workload.target_ttft_s > 0


def test_unknown_space_lists_the_shipped_ones():
    with pytest.raises(InputError, match="article-004-8xv100-32gb"):
        load_space("no-such-space")


def test_nearest_snaps_into_the_space():
    from tuner.space import Param

    seqs = Param("max_num_seqs", "categorical", choices=(32, 64, 128))
    assert seqs.nearest(1024) == 128 and seqs.nearest(50) == 64 and seqs.nearest(None) == 32
    gmu = Param("gpu_memory_utilization", "float", low=0.8, high=0.95, step=0.05)
    assert gmu.nearest(0.92) == 0.9 and gmu.nearest(0.99) == 0.95
    eager = Param("enforce_eager", "categorical", choices=(False, True))
    assert eager.nearest(True) is True


def test_numeric_choices_are_stored_under_the_knob_with_their_real_values():
    import optuna
    from optuna.distributions import CategoricalDistribution, IntDistribution

    space = parse_space("parameters:\n  max_num_seqs: {choices: [256, 32, 64]}\n  block_size: {choices: [16, 32]}\n"
                        "  max_num_batched_tokens: {choices: [6144, 2048, 4096]}\n",
                        path="my.yaml").bind(Deployment(), num_heads=28)
    seqs, block, mbt = space.params
    assert (seqs.kind, seqs.choices, seqs.key) == ("ordinal", (32, 64, 256), "max_num_seqs")
    assert block.kind == "categorical"  # two values: nothing lies between them
    # evenly spaced: a range on that step, which the sampler models as numbers; a ladder: its values
    assert mbt.distribution() == IntDistribution(2048, 6144, step=2048)
    assert seqs.distribution() == CategoricalDistribution([32, 64, 256])
    config = ServeConfig(max_num_seqs=64, block_size=32, max_num_batched_tokens=4096)
    assert space.params_of(config) == {"max_num_seqs": 64, "block_size": 32, "max_num_batched_tokens": 4096}
    assert space.config_from_params(space.params_of(config)) == config
    assert space.grid()["max_num_seqs"] == [32, 64, 256]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(12):
        trial = study.ask()
        config = space.suggest(trial)
        assert trial.params == space.params_of(config)  # what Optuna stores is what the server ran
        study.tell(trial, 0.0)
    assert {t.params["max_num_batched_tokens"] for t in study.trials} <= {2048, 4096, 6144}


def test_a_study_written_with_index_params_keeps_them_and_reads_them_as_values():
    space = parse_space("parameters:\n  max_num_seqs: {choices: [32, 64, 256]}\n"
                        "  max_num_batched_tokens: {choices: [2048, 4096, 8192]}\n",
                        path="my.yaml").bind(Deployment(), num_heads=28)
    old = {"max_num_seqs_index": 2, "max_num_batched_tokens_index": 0}
    config = space.config_from_params(old)  # migration on read: the index is the choice
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (256, 2048)
    # resumed, a study keeps the encoding its trials hold (Optuna keeps one per parameter)
    kept = space.encoded_for(["max_num_seqs_index", "layout"])
    assert [p.key for p in kept.params] == ["max_num_seqs_index", "max_num_batched_tokens"]
    assert kept.params_of(config) == {"max_num_seqs_index": 2, "max_num_batched_tokens": 2048}
    assert kept.fingerprint() == space.fingerprint()  # the same space: the study's identity holds
    assert kept.config_from_params({"max_num_seqs": 64, "max_num_batched_tokens": 4096}).max_num_seqs == 64
    assert space.encoded_for(["max_num_seqs", "block_size"]) is space


def test_repeated_choices_are_bad_input():
    with pytest.raises(InputError, match="repeat"):
        parse_space("parameters:\n  max_num_seqs: {choices: [32, 32, 64]}\n", path="my.yaml")


# -- absurd values and damaged files: one line, file:line, the allowed range -------------------
@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("deployment:\n  gpus: 1000000\n", 2, "deployment.gpus: 1000000 GPUs is more than tuner plans for (1-4096)"),
        ("deployment:\n  model: 7\n", 2, "deployment.model: must be a name, got 7"),
        ("deployment:\n  model: no-such-model\n", 2, "deployment.model: unknown model"),
        ("deployment:\n  gpu: no-such-gpu\n", 2, "deployment.gpu: unknown GPU"),
        ("deployment:\n  vllm_version: 0.10\n", 2, "quote it"),
        ("workload:\n  requests: 1e15\n", 2, "workload.requests: must be a whole number in 1-10,000,000"),
        ("workload:\n  requests: 12.5\n", 2, "1-10,000,000"),
        ("workload:\n  seed: -1\n", 2, "workload.seed: must be a whole number in 0-4294967295"),
        ("workload:\n  rate: .inf\n", 2, "workload.rate: must be in 1e-06-1e+06 requests/s"),
        ("workload:\n  rate: .nan\n", 2, "requests/s"),
        ("workload:\n  target_ttft_s: 2d\n", 2, "(0, 86400]"),
        ("workload:\n  trace: no/such/log.csv\n", 2, "no such file"),
        ("parameters:\n  max_model_len: 1000000000000\n", 2, "max_model_len: must be an integer in 1-10,000,000"),
        ("parameters:\n  max_num_seqs: {low: 1, high: 100000000}\n", 2, "max_num_seqs.high: must be an integer in 1-65,536"),  # noqa: E501
        ("parameters:\n  gpu_memory_utilization: 5\n", 2, "(0, 1]"),
        ("parameters:\n  gpu_memory_utilization: {low: .nan, high: 0.9}\n", 2, "(0, 1]"),
        ("parameters:\n  kv_cache_dtype: null\n", 2, "leave the key out"),
        ("parameters:\n  max_num_seqs: {low: 1, high: 8, log: 'yes'}\n", 2, "true or false"),
        ("layouts: [tp1x1000000]\n", 1, "(1-4096)"),
        ("name: x\nname: y\n", 2, "'name' is given twice (lines 1 and 2)"),
        ("name: " + "[" * 40 + "]" * 40 + "\n", 1, "nested more than 32 levels"),
        ("name: " + "9" * 5000 + "\n", 1, "a number of 5,000 characters"),
        ("name: x\n---\nname: y\n", 2, "second YAML document"),
        ("", 1, "holds nothing"),
        ("- a\n- b\n", 1, "holds a list"),
        ("a: 1\nb: \x00\n", 2, "character #x0000"),
    ],
)
def test_absurd_values_and_damaged_files_are_refused_at_their_line(text, line, words):
    err = _error(text)
    assert (err.path, err.line) == ("my.yaml", line)
    assert str(err).startswith(f"my.yaml:{line}: ") and "\n" not in str(err)
    assert words in str(err)


def test_values_at_the_limits_are_read():
    space = parse_space("deployment: {gpus: 4096}\nworkload: {requests: 10000000, seed: 4294967295, rate: 1e6}\n"
                        "parameters:\n  max_model_len: 10000000\n  max_num_seqs: {low: 1, high: 65536, log: true}\n",
                        path="my.yaml")
    assert space.deployment.gpu_count == 4096 and space.workload.requests == 10_000_000
    assert space.workload.rate == 1e6  # "1e6" is text to PyYAML (YAML 1.1), a number to users
    bound = space.bind(space.deployment, num_heads=28)
    assert bound.layouts == ((1, 4096), (2, 2048), (4, 1024))


def test_non_utf8_bytes_are_refused_at_their_line(tmp_path):
    path = tmp_path / "latin.yaml"
    path.write_bytes(b"name: x\ndescription: caf\xe9\n")
    with pytest.raises(InputError) as info:
        load_space(path)
    assert str(info.value).startswith(f"{path}:2: not UTF-8 text: byte 0xe9 at column 17")


def test_an_alias_bomb_is_refused_without_expanding_it():
    bomb = "[&a [x, x, x, x, x, x, x, x, x, x], " + ", ".join(
        f"&{chr(97 + k)} [" + ", ".join([f"*{chr(96 + k)}"] * 10) + "]" for k in range(1, 9)) + "]"
    err = _error(f"name: {bomb}\n")  # 10**9 leaves, if anything walked or printed them all
    assert err.line == 1 and "name: must be text" in str(err) and len(str(err)) < 300


def test_a_space_names_its_calibration_profile_problems(tmp_path):
    profile = tmp_path / "profile.yaml"
    profile.write_text("hbm_efficiency: {value: 0.8, source: fit}\nmemory:\n  non_torch_bytes: lots\n")
    err = _error(f"deployment:\n  gpu: H200\n  calibration: {profile}\n")
    assert str(err).startswith(f"{profile}:3: memory.non_torch_bytes must be a number")
    err = _error("deployment:\n  calibration: no/such/profile.yaml\n")
    assert err.line == 2 and "no calibration profile" in str(err)


# -- the files a space names ----------------------------------------------------------
AZURE_ROWS = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2023-11-16 18:15:{i:02d}.0000000,{300 + 17 * i},{40 + i}\n" for i in range(30))


def _space_file(folder, trace: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mine.yaml"
    path.write_text(GOOD.replace("  requests: 50\n", f"  requests: 50\n  trace: {trace}\n"))
    return str(path)


def test_a_relative_trace_in_a_space_file_is_read_from_the_space_files_folder(tmp_path, monkeypatch):
    from tuner.search.workflow import prepare

    (tmp_path / "spaces" / "logs").mkdir(parents=True)
    (tmp_path / "spaces" / "logs" / "requests.csv").write_text(AZURE_ROWS)
    path = _space_file(tmp_path / "spaces", "logs/requests.csv")
    monkeypatch.chdir(tmp_path)  # the working directory holds no logs/ folder
    prepared = prepare(path)
    assert len(prepared.workload) == 30 and prepared.workload.prompt_tokens[1] == 317
    # the same relative path, with the file beside the working directory instead: refused
    (tmp_path / "spaces" / "logs" / "requests.csv").rename(tmp_path / "requests.csv")
    (tmp_path / "logs").mkdir()
    (tmp_path / "requests.csv").rename(tmp_path / "logs" / "requests.csv")
    with pytest.raises(InputError) as info:
        load_space(path)
    assert info.value.path == path and info.value.line == 9 and "space file's folder" in str(info.value)


def test_trace_on_the_command_line_rescues_a_space_whose_own_trace_is_missing(tmp_path, monkeypatch):
    from tuner.search.workflow import prepare

    path = _space_file(tmp_path / "spaces", "gone/requests.csv")
    (tmp_path / "mine.csv").write_text(AZURE_ROWS)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        load_space(path)
    prepared = prepare(path, workload={"trace": "mine.csv"})  # as tuner search --trace mine.csv passes it
    assert prepared.space.workload.trace == "mine.csv" and len(prepared.workload) == 30


def test_a_pinned_knob_leaves_the_search_and_names_the_space():
    space = load_space("default")
    searched = {p.name for p in space.params}
    assert "max_num_seqs" in searched
    pinned = space.pinned({"max_num_seqs": "256", "enforce_eager": "true"}, where={"max_num_seqs": "--set x"})
    assert {p.name for p in pinned.params} == searched - {"max_num_seqs", "enforce_eager"}
    assert dict(pinned.fixed)["max_num_seqs"] == 256 and dict(pinned.fixed)["enforce_eager"] is True
    assert pinned.name != space.name and pinned.fingerprint() != space.fingerprint()
    assert space.pinned({}) is space
    with pytest.raises(InputError, match=r"^--set x: max_num_seqs must be an integer"):
        space.pinned({"max_num_seqs": 0}, where={"max_num_seqs": "--set x"})
    with pytest.raises(InputError, match="not a knob tuner can pin"):
        space.pinned({"speed": 2})


def test_a_pinned_tp_or_replica_count_keeps_only_the_layouts_with_it():
    space = parse_space("layouts: [tp1x4, tp2x2, tp4x1]\n", path="my.yaml")
    four = Deployment(gpu_count=4)
    bound = space.bind(four, num_heads=28)
    by_tp = space.pinned({"tensor_parallel_size": 2}).bind(four, num_heads=28)
    assert by_tp.layouts == ((2, 2),) and by_tp.grid() == {k: v for k, v in bound.grid().items() if k != "layout"}
    assert by_tp.name == "my+tensor_parallel_size=2" and by_tp.fingerprint() != bound.fingerprint()
    assert space.pinned({"replicas": "1"}).bind(four, num_heads=28).layouts == ((4, 1),)
    auto = parse_space("layouts: auto\n", path="my.yaml").pinned({"replicas": 2, "max_num_seqs": 64})
    assert auto.bind(Deployment(gpu_count=8), num_heads=28).layouts == ((4, 2),)  # of tp1x8, tp2x4, tp4x2


@pytest.mark.parametrize("layouts, pin, words", [
    ("[tp1x4, tp2x2, tp4x1]", {"tensor_parallel_size": 3}, "tensor_parallel_size=3 leaves no layout: the space has "
                                                           "tp1x4, tp2x2, tp4x1"),
    ("[tp1x4, tp2x2]", {"tensor_parallel_size": 2, "replicas": 1}, "tensor_parallel_size=2 replicas=1 leaves no"),
    ("auto", {"tensor_parallel_size": 8}, "the space has tp1x8, tp2x4, tp4x2 (auto: each TP that divides the 28"),
    ("auto", {"replicas": 0}, "replicas takes a whole number from 1"),
])
def test_a_layout_pin_that_leaves_none_names_the_space_layouts(layouts, pin, words):
    space = parse_space(f"layouts: {layouts}\n", path="my.yaml")
    with pytest.raises(InputError, match=re.escape(words)):
        space.pinned(pin).bind(Deployment(gpu_count=8 if layouts == "auto" else 4), num_heads=28)
