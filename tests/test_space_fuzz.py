"""Search-space, calibration-profile and GPU-catalog YAML, mutated and generated (beside the
trace fuzzing of tests/traffic/test_trace_fuzz.py): every document is read, or refused with
one line that names the file and, for a search space always and elsewhere when a key is at
fault, the line. Never a traceback, a hang or a huge allocation.

The deterministic corpus takes the shipped files and deletes, duplicates and retypes their
keys, puts absurd numbers in (``requests: 1e15``, ``seed: -1``, ``gpus: 1000000``, NaN,
``.inf``), and damages the text (non-UTF-8 bytes, tabs, truncation, binary junk, deep
nesting, alias bombs). Hypothesis then draws documents from the schema with valid and
invalid values.
"""
from __future__ import annotations

import copy
import math
import random
import re
import signal
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tuner.core.errors import InputError
from tuner.core.knobs import MAX_TOKENS
from tuner.search import build_workload, num_heads
from tuner.serving.config import MAX_GPUS
from tuner.sim.calibration import DATA_DIR, load_calibration, memory_overrides, profile_section
from tuner.sim.hardware import get_gpu, load_catalog
from tuner.space import MAX_REQUESTS, MAX_TTFT_S, SEED_LIMIT, list_spaces, load_space

TUNER_DATA = Path(__file__).resolve().parents[1] / "tuner" / "data"
CALIBRATIONS = [DATA_DIR / "hopper.yaml", DATA_DIR / "h200-vllm-0.26.0" / "profile.yaml"]
CATALOG = TUNER_DATA / "gpus.yaml"
SPACES_DIR = Path(__file__).resolve().parents[1] / "search_spaces"
#: Workloads above this many requests are not built here (the limit keeps them bounded).
BUILD_AT_MOST = 100_000
#: Seconds one document may take to read: a hang is a failure, not a stuck test run.
TIME_LIMIT = 20


# -- reading a document the way the tool does ------------------------------------------------
def read_space(path: str) -> None:
    """What ``tuner search --space PATH`` does before its first trial."""
    space = load_space(path)
    dep, wl = space.deployment, space.workload
    # what was read is inside the ranges tuner plans for
    assert 1 <= dep.gpu_count <= MAX_GPUS and 1 <= wl.requests <= MAX_REQUESTS and 0 <= wl.seed < SEED_LIMIT
    assert math.isfinite(wl.rate) and wl.rate > 0 and 0 < wl.target_ttft_s <= MAX_TTFT_S
    space = space.bind(dep, num_heads(dep))
    for value in [p.grid_values(2)[-1] for p in space.params] + [p.grid_values(2)[0] for p in space.params]:
        assert not isinstance(value, float) or math.isfinite(value)
    for name, value in space.fixed + tuple((p.name, p.high) for p in space.params if p.high is not None):
        if name in ("max_model_len", "max_num_batched_tokens") and value is not None:
            assert value <= MAX_TOKENS
    params = {p.key: p.encode(p.grid_values(2)[-1]) for p in space.params}
    params["layout"] = space.layout_choices[-1]
    assert space.config_from_params(params).gpus_needed <= dep.gpu_count
    space.grid()
    if wl.requests <= BUILD_AT_MOST:
        assert len(build_workload(wl, dep)) == wl.requests


def read_calibration(path: str) -> None:
    """A profile named by ``Deployment.calibration``: its constants over the class table,
    its memory overrides and its ``match`` section."""
    gpu = get_gpu("H200")
    load_calibration(gpu, path)
    memory_overrides(gpu.name, "0.26.0", path)
    profile_section(path, "match")


def read_class_table(path: str) -> None:
    """A shipped class table (``tuner/data/calibration/<class>.yaml``) as edited by hand:
    every constant, no base to fall back on; then as a profile over the shipped table."""
    from tuner.sim.calibration import _from_yaml

    _from_yaml(Path(path))
    read_calibration(path)


def read_catalog(path: str) -> None:
    load_catalog(path)


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def alarm(*_: Any) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


#: Mutants whose fault is the whole file, not one line: their message names the file only.
WHOLE_FILE = ("huge file",)


def outcome(read: Callable[[str], None], path: str, data: bytes, *, need_line: bool) -> str:
    """``ok``, ``line`` (one-line InputError with path:line), ``path`` (path only, allowed
    when ``need_line`` is False), or a description of what went wrong."""
    Path(path).write_bytes(data)
    try:
        with time_limit(TIME_LIMIT):
            read(path)
    except InputError as err:
        text = str(err)
        if "\n" in text.strip():
            return f"multi-line message: {text!r}"
        if re.match(rf"{re.escape(path)}:\d+: \S", text):
            return "line"
        if text.startswith(f"{path}: ") and not need_line:
            return "path"
        return f"message without {'file:line' if need_line else 'file'}: {text}"
    except Exception as err:  # noqa: BLE001 - the point of the test
        return f"traceback {type(err).__name__}: {str(err)[:200]}"
    return "ok"


# -- the mutation corpus ---------------------------------------------------------------------
UNREAD = ("fit", "ci95", "determined")
RETYPES: list[Any] = [7, "x", [1, 2], {"a": 1}, None, True]
NUMBERS: list[Any] = [-1, 0, 2.5, 10**12, 1e15, math.inf, -math.inf, math.nan]


def _paths(data: Any, prefix: tuple[Any, ...] = (), *, entries: int | None = None) -> Iterator[tuple[Any, ...]]:
    """Every key path of a document, depth first: mapping keys and list positions (inside
    the first ``entries`` top-level keys only, when given: catalog entries look alike; not
    inside what no reader looks into: a profile's ``fit`` report, a constant's interval)."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for n, (key, value) in enumerate(items):
        yield prefix + (key,)
        if (entries is None or n < entries) and key not in UNREAD:
            yield from _paths(value, prefix + (key,))


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        data = data[key]
    return data


def _set(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(data)
    _get(out, path[:-1])[path[-1]] = value
    return out


def _delete(data: Any, path: tuple[Any, ...]) -> Any:
    out = copy.deepcopy(data)
    del _get(out, path[:-1])[path[-1]]
    return out


def _dump(data: Any) -> bytes:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode()


#: libyaml's emitter where PyYAML has it: for the corpora's thousands of mutants it writes the
#: same bytes as :func:`_dump` (checked over every shipped file), five times faster. The
#: generated documents' odd strings keep the pure-Python emitter.
_CORPUS_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _dump_corpus(data: Any) -> bytes:
    return yaml.dump(data, Dumper=_CORPUS_DUMPER, sort_keys=False, allow_unicode=True).encode()


def data_mutants(text: str, entries: int | None = None) -> Iterator[tuple[str, bytes]]:
    """Keys deleted, retyped, and numbers made absurd, one at a time."""
    data = yaml.safe_load(text)
    for path in _paths(data, entries=entries):
        where = ".".join(map(str, path))
        yield f"delete {where}", _dump_corpus(_delete(data, path))
        value = _get(data, path)
        for new in RETYPES:
            if new != value:
                yield f"{where} = {new!r}", _dump_corpus(_set(data, path, new))
        if isinstance(value, (int, float)) and not isinstance(value, bool) or value is None:
            for new in NUMBERS:
                yield f"{where} = {new!r}", _dump_corpus(_set(data, path, new))
        if isinstance(value, dict):  # a list where a map is expected
            yield f"{where} as a list", _dump_corpus(_set(data, path, list(value.items())))


def text_mutants(text: str, last_line: int | None = None) -> Iterator[tuple[str, bytes]]:
    """Damage done to the text, line by line (up to ``last_line``): each line deleted and
    doubled (duplicate keys), and in turn indented with a tab, cut in half or given
    non-UTF-8 bytes."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines[:last_line]):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        head, tail = "".join(lines[:i]), "".join(lines[i + 1:])
        yield f"line {i + 1} deleted", (head + tail).encode()
        yield f"line {i + 1} twice", (head + line + line + tail).encode()
        if i % 3 == 0:
            yield f"line {i + 1} tab", (head + "\t" + line + tail).encode()
        elif i % 3 == 1:
            yield f"line {i + 1} cut", (head + line[: len(line) // 2]).encode()
        else:
            yield f"line {i + 1} latin-1", head.encode() + b"\xff\xfe " + line.encode() + tail.encode()


def whole_file_mutants(text: str) -> Iterator[tuple[str, bytes]]:
    rng = random.Random(0)
    yield "empty file", b""
    yield "comments only", b"# nothing here\n"
    yield "a list at top level", b"- name: x\n- deployment: {}\n"
    yield "a bare string", b"just words\n"
    yield "a number", b"7\n"
    yield "binary junk", rng.randbytes(400)
    yield "NUL bytes", b"name: a\x00b\n"
    yield "UTF-16", text.encode("utf-16")
    yield "UTF-8 BOM", b"\xef\xbb\xbf" + text.encode()
    yield "CRLF line ends", text.replace("\n", "\r\n").encode()
    yield "deeply nested list", b"name: " + b"[" * 5000 + b"]" * 5000 + b"\n"
    yield "deeply nested map", "".join(f"{' ' * i}k{i}:\n" for i in range(400)).encode() + b" " * 400 + b"v\n"
    # anchors nine levels deep, ten aliases each: 10**9 leaves if anything expanded them
    bomb = "[&a [x, x, x, x, x, x, x, x, x, x], " + ", ".join(
        f"&{chr(97 + k)} [" + ", ".join([f"*{chr(96 + k)}"] * 10) + "]" for k in range(1, 9)) + "]"
    first_key = next(line.split(":")[0] for line in text.splitlines() if line and line[0].isalpha())
    yield "alias bomb at the first key", f"{first_key}: {bomb}\n".encode()
    yield "alias bomb as a list of choices", f"parameters: {{max_num_seqs: {{choices: {bomb}}}}}\n".encode()
    yield "alias bomb as layouts", f"layouts: {bomb}\n".encode()
    yield "a list that holds itself", f"{first_key}: &self [1, *self]\n".encode()
    chain = "".join(f"k{i}: &k{i} [*k{i - 1}]\n" for i in range(1, 2000))
    yield "2000 aliases deep", f"k0: &k0 [x]\n{chain}".encode()
    yield "alias to nothing", f"{first_key}: *nothing\n".encode()
    yield "two documents", (text + "\n---\n" + text).encode()
    yield "5000-digit number", text.encode() + b"\nx: " + b"9" * 5000 + b"\n"
    yield "huge file", text.encode() + b"# padding\n" * 300_000
    yield "unhashable key", b"? [a, b]\n: 1\n"
    yield "merge key", b"base: &b {gpu: H100-SXM}\n"
    yield "tab indentation", text.replace("  ", "\t").encode()


#: The issue's own examples and other absurd values, on top of the shipped default space.
SPACE_EDITS: list[tuple[str, str]] = [
    ("model: qwen2.5-7b", "model: 7"),
    ("model: qwen2.5-7b", "model: no-such-model"),
    ("model: qwen2.5-7b", "model: ''"),
    ("gpu: H100-SXM", "gpu: no-such-gpu"),
    ("gpu: H100-SXM", "gpu: [H100]"),
    ("gpus: 1  ", "gpus: 1000000  "),
    ("gpus: 1  ", "gpus: 4096  "),
    ("gpus: 1  ", "gpus: 4097  "),
    ("gpus: 1  ", "gpus: 2.5  "),
    ("gpus: 1  ", "gpus: '8'  "),
    ("gpus: 1  ", "gpus: 1\n  gpu_ids: [0, 0]\n  "),
    ("gpus: 1  ", "gpus: 2\n  gpu_ids: 5\n  "),
    ("gpus: 1  ", "gpus: 1\n  gpu_ids: [-1]\n  "),
    ("gpus: 1  ", "gpus: 1\n  vllm_version: 0.10\n  "),
    ("gpus: 1  ", "gpus: 1\n  vllm_version: banana\n  "),
    ("gpus: 1  ", "gpus: 1\n  calibration: no/such/profile.yaml\n  "),
    ("gpus: 1  ", "gpus: 1\n  calibration: 7\n  "),
    ("requests: 1000", "requests: 1e15"),
    ("requests: 1000", "requests: 1.0e+15"),
    ("requests: 1000", "requests: 10000001"),
    ("requests: 1000", "requests: 12.5"),
    ("requests: 1000", "requests: 0x10"),
    ("seed: 0", "seed: -1"),
    ("seed: 0", "seed: 4294967296"),
    ("seed: 0", "seed: 1.5"),
    ("rate: 10", "rate: .inf"),
    ("rate: 10", "rate: .nan"),
    ("rate: 10", "rate: 1.0e-300"),
    ("load: concurrency", "load: trace"),
    ("load: concurrency", "load: [1]"),
    ("trace: null", "trace: 7"),
    ("trace: null", "trace: no/such/trace.csv"),
    ("target_ttft_s: 2s", "target_ttft_s: 1e400"),
    ("target_ttft_s: 2s", "target_ttft_s: 100000000000000000000000000000000000000000000000000000000"),
    ("target_ttft_s: 2s", "target_ttft_s: 30d"),
    ("target_ttft_s: 2s", "target_ttft_s: .nan"),
    ("target_ttft_s: 2s", "target_ttft_s: -2s"),
    ("{low: 0.80, high: 0.95, step: 0.05}", "5"),
    ("{low: 0.80, high: 0.95, step: 0.05}", "{low: 0.8, high: 5}"),
    ("{low: 0.80, high: 0.95, step: 0.05}", "{low: .nan, high: 0.9}"),
    ("{low: 0.80, high: 0.95, step: 0.05}", "{low: 0.8, high: 0.9, log: 'yes'}"),
    ("{low: 0.80, high: 0.95, step: 0.05}", "{low: 0.8, high: 0.9, step: 1.0e-300}"),
    ("{low: 0.80, high: 0.95, step: 0.05}", "1" + "0" * 400),
    ("{choices: [8192, 32768]}", "1000000000000"),
    ("{choices: [8192, 32768]}", "{low: 1, high: 1000000000000, log: true}"),
    ("{choices: [8192, 32768]}", "{low: 1024, high: 10000000, log: true}"),
    ("{choices: [8192, 32768]}", "{choices: []}"),
    ("{choices: [8192, 32768]}", "{choices: " + str(list(range(1, 5000))) + "}"),
    ("{choices: [8192, 32768]}", "{choices: [.inf]}"),
    ("{choices: [32, 64, 128, 256, 512]}", "{low: 1, high: 100000000}"),
    ("{choices: [2048, 4096, 8192, 16384]}", "{choices: [0, 4096]}"),
    ("{choices: [16, 32]}", "1000000"),
    ("{choices: [true, false]}", "null"),
    ("{choices: [true, false]}", "'yes'"),
    ("{choices: [auto, fp8]}", "null"),
    ("{choices: [auto, fp8]}", "{low: 1, high: 2}"),
    ("layouts: auto", "layouts: [tp3x5]"),
    ("layouts: auto", "layouts: [tp0x1]"),
    ("layouts: auto", "layouts: [banana]"),
    ("layouts: auto", "layouts: [7]"),
    ("layouts: auto", "layouts: {tp: 1}"),
    ("layouts: auto", "layouts: [tp1x1000000]"),
    ("layouts: auto", "layouts: [tp" + "9" * 5000 + "x1]"),
    ("layouts: auto", "layouts: []"),
    ("layouts: auto", "layouts: manual"),
    ("gpus: 1  ", "gpus: 4096  "),
    ("name: default", "name: [a, b]"),
    ("name: default", "name: 'a/b c'"),
    ("name: default", "name: default\nname: again"),
    ("name: default", "name: default\nworkload: {}"),
    ("name: default", "name: default\nbogus: 1"),
    ("deployment:", "deployment: &d"),
]


def space_edits(text: str) -> Iterator[tuple[str, bytes]]:
    for old, new in SPACE_EDITS:
        assert old in text, old
        yield f"{old!r} -> {new[:40]!r}", text.replace(old, new, 1).encode()
    yield "layouts auto on 4096 GPUs", text.replace("gpus: 1  ", "gpus: 4096  ").encode()
    yield "merge keys", (text + "extra: &e {gpus: 2}\n").encode()


def corpus(source: Path, extra: Callable[[str], Iterator[tuple[str, bytes]]] | None = None, *,
           entries: int | None = None, last_line: int | None = None, text: str | None = None) -> dict[str, bytes]:
    """Name -> bytes of every mutant of ``source`` (or of ``text``, a part of it; the same
    bytes once); ``entries`` and ``last_line`` keep a long file's look-alike parts from
    dominating."""
    text = source.read_text(encoding="utf-8") if text is None else text
    out: dict[str, bytes] = {}
    seen: set[bytes] = set()
    makers: list[Callable[[str], Iterator[tuple[str, bytes]]]] = [
        lambda t: data_mutants(t, entries), lambda t: text_mutants(t, last_line), whole_file_mutants]
    for make in makers + ([extra] if extra else []):
        for name, data in make(text):
            if data not in seen:
                seen.add(data)
                out[f"{source.name}: {name}"] = data
    return out


def run_corpus(read: Callable[[str], None], mutants: dict[str, bytes], *, need_line: bool,
               name: str = "bad.yaml") -> tuple[Counter[str], list[str]]:
    counts: Counter[str] = Counter()
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, data) in enumerate(mutants.items()):
            path = str(Path(tmp) / f"{i}-{name}")  # a new file each: readers cache per path and mtime
            result = outcome(read, path, data, need_line=need_line and not label.endswith(WHOLE_FILE))
            if result in ("ok", "line", "path"):
                counts[result] += 1
            else:
                counts["bad"] += 1
                failures.append(f"{label}: {result}")
    return counts, failures


def _report(what: str, counts: Counter[str], failures: list[str]) -> None:
    print(f"\n{what}: {sum(counts.values())} mutants: {counts['ok']} read, {counts['line']} refused "
          f"with file:line, {counts['path']} with file only, {counts['bad']} bad")
    assert not failures, "\n".join(failures[:30])


@pytest.mark.parametrize("source", list_spaces(), ids=lambda p: p.stem)
def test_search_space_mutants_end_in_file_line_or_work(source):
    extra = space_edits if source.stem == "default" else None
    counts, failures = run_corpus(read_space, corpus(source, extra), need_line=True)
    _report(source.name, counts, failures)
    assert counts["line"] > counts["ok"]  # the corpus is mostly broken files, refused


def calibration_corpus(source: Path) -> dict[str, bytes]:
    """A fitted profile's ``fit`` report (from line 72) is read by no one: mutate the
    sections before it line by line."""
    return corpus(source, last_line=72 if source.name == "profile.yaml" else None)


@pytest.mark.parametrize("source", CALIBRATIONS, ids=lambda p: p.parent.name if p.name == "profile.yaml" else p.stem)
def test_calibration_mutants_end_in_one_line_or_work(source):
    read = read_calibration if source.name == "profile.yaml" else read_class_table
    counts, failures = run_corpus(read, calibration_corpus(source), need_line=False)
    _report(source.name, counts, failures)
    assert counts["line"] > counts["path"]  # most faults are one key's, and say its line


def catalog_corpus() -> dict[str, bytes]:
    """The catalog's entries look alike: mutate its header and first two entries."""
    head = CATALOG.read_text(encoding="utf-8").split("\nT4:")[0]
    assert yaml.safe_load(head).keys() == {"V100-16GB-PCIE", "V100-32GB-SXM2"}
    return corpus(CATALOG, text=head)


def test_gpu_catalog_mutants_end_in_one_line_or_work():
    counts, failures = run_corpus(read_catalog, catalog_corpus(), need_line=False)
    _report(CATALOG.name, counts, failures)
    assert counts["line"] > counts["path"]


# -- generated documents ---------------------------------------------------------------------
JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**13), st.floats(),
    st.text(max_size=6), st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2),
)
NUMBER = st.one_of(st.integers(-10, 10**8), st.floats(), st.sampled_from([0, 1, 10**12, 1e15, "1e6", 2**32]))


def field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a value of the right kind, sometimes anything."""
    return st.one_of(valid, valid, JUNK)


DEPLOYMENT = st.fixed_dictionaries({}, optional={
    "model": field(st.sampled_from(["qwen2.5-7b", "llama-3.1-8b", "Qwen2.5-7B", "no-such-model"])),
    "gpu": field(st.sampled_from(["H100-SXM", "V100-32GB-SXM2", "h200", "no-such-gpu"])),
    "gpus": field(st.one_of(st.integers(-2, 9), st.sampled_from([4096, 4097, 10**6]))),
    "dtype": field(st.sampled_from(["auto", "float16", "bfloat16", "int3"])),
    "quantization": field(st.sampled_from([None, "awq", "gptq", "fp8", "int3"])),
    "vllm_version": field(st.sampled_from(["0.26.0", "0.6.3", 0.1, "v0.9.2", "x"])),
    "gpu_ids": field(st.lists(st.integers(-1, 9), max_size=3)),
})
WORKLOAD = st.fixed_dictionaries({}, optional={
    "target_ttft_s": field(st.one_of(NUMBER, st.sampled_from(["2s", "500ms", "1d", "2d", "-1s", "1e400", "soon"]))),
    "trace": field(st.none()),
    "requests": field(st.one_of(st.integers(-5, 3000), st.sampled_from([MAX_REQUESTS + 1, 10**15, 1.0e15, 2.5]))),
    "rate": field(NUMBER),
    "load": field(st.sampled_from(["concurrency", "rate", "trace", "burst"])),
    "seed": field(st.one_of(st.integers(-3, 10), st.sampled_from([SEED_LIMIT - 1, SEED_LIMIT, -1]))),
})
KNOB_VALUE = {
    "gpu_memory_utilization": st.one_of(st.floats(0, 1.5), NUMBER),
    "max_num_seqs": st.one_of(st.integers(-1, 70_000), NUMBER),
    "max_model_len": st.one_of(st.integers(-1, 2 * MAX_TOKENS), NUMBER),
    "block_size": st.one_of(st.sampled_from([0, 1, 8, 16, 32, 1024, 1025]), NUMBER),
    "max_num_batched_tokens": st.one_of(st.integers(-1, 2 * MAX_TOKENS), NUMBER),
    "enable_prefix_caching": st.booleans(),
    "enforce_eager": st.booleans(),
    "kv_cache_dtype": st.sampled_from(["auto", "fp8", "fp8_e5m2", "int3"]),
}


@st.composite
def knob_spec(draw: st.DrawFn, name: str) -> Any:
    value = KNOB_VALUE[name]
    kind = draw(st.sampled_from(["fixed", "range", "choices", "junk"]))
    if kind == "fixed":
        return draw(field(value))
    if kind == "choices":
        return {"choices": draw(st.lists(field(value), max_size=5))}
    if kind == "junk":
        return draw(JUNK)
    spec = {"low": draw(field(value)), "high": draw(field(value))}
    if draw(st.booleans()):
        spec["step"] = draw(field(value))
    if draw(st.booleans()):
        spec["log"] = draw(field(st.booleans()))
    return spec


@st.composite
def space_documents(draw: st.DrawFn) -> Any:
    doc: dict[Any, Any] = {}
    if draw(st.booleans()):
        doc["name"] = draw(field(st.text(min_size=1, max_size=12)))
    for key, strategy in (("deployment", DEPLOYMENT), ("workload", WORKLOAD)):
        if draw(st.booleans()):
            doc[key] = draw(field(strategy))
    if draw(st.booleans()):
        names = draw(st.lists(st.sampled_from(sorted(KNOB_VALUE)), unique=True, max_size=4))
        doc["parameters"] = {name: draw(knob_spec(name)) for name in names}
    if draw(st.booleans()):
        layout = st.sampled_from(["tp1x1", "tp2x4", "tp4x2", "tp1x8", "tp3x1", "tp0x2", "tp1x5000", "banana"])
        doc["layouts"] = draw(st.one_of(st.just("auto"), st.lists(field(layout), max_size=3), JUNK))
    if draw(st.integers(0, 9)) == 0:
        doc[draw(st.text(max_size=5))] = draw(JUNK)
    return draw(st.one_of(st.just(doc), st.just(doc), JUNK))


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(read: Callable[[str], None], data: bytes, *, need_line: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        result = outcome(read, str(Path(tmp) / "bad.yaml"), data, need_line=need_line)
    assert result in ("ok", "line", "path"), result


@FUZZ
@given(doc=space_documents())
@example(doc={"\r": None})  # a key that is a line break: the message stays one line
def test_generated_search_spaces_are_read_or_refused_at_their_line(doc):
    _check(read_space, _dump(doc), need_line=True)


NASTY = st.sampled_from(list(":-[]{}&*!|>'\"#%@`,? \t\n0123456789.") + ["\x00", "\xff", "1e400", ".nan", "<<", "---", "~"])  # noqa: E501


@st.composite
def damaged(draw: st.DrawFn, sources: list[Path]) -> bytes:
    data = draw(st.sampled_from(sources)).read_bytes()
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(data)))
        j = draw(st.integers(i, min(len(data), i + 12)))
        junk = "".join(draw(st.lists(NASTY, min_size=1, max_size=4))).encode("utf-8", "surrogateescape")
        data = data[:i] + (junk if draw(st.booleans()) else b"") + data[j:]
    return data


@settings(FUZZ, max_examples=100)
@given(data=damaged(list_spaces()))
def test_damaged_search_spaces_are_read_or_refused_at_their_line(data):
    _check(read_space, data, need_line=True)


# -- calibration profiles and GPU catalogs, generated ------------------------------------------
SECONDS = st.one_of(st.floats(-1, 20), NUMBER)
CONSTANT = {
    "gpu_class": st.sampled_from(["hopper", "ampere", ""]),
    "calibrated": st.booleans(),
    "hbm_efficiency": st.one_of(st.floats(-0.5, 1.5), NUMBER),
    "flops_efficiency": st.one_of(st.floats(-0.5, 1.5), NUMBER),
    "link_efficiency": st.one_of(st.floats(-0.5, 1.5), NUMBER),
    "step_overhead_s": SECONDS,
    "per_seq_overhead_s": SECONDS,
    "allreduce_latency_s": SECONDS,
    "request_latency_s": SECONDS,
    "launch_per_layer_s": st.dictionaries(st.sampled_from(["graph", "piecewise", "compiled", "eager", "grpah"]),
                                          field(SECONDS), max_size=5),
}
MEMORY_KEYS = ["weight_overhead_bytes", "activation_fixed_bytes", "cudagraph_kv_fraction", "non_torch_bytes", "bogus"]


@st.composite
def profiles(draw: st.DrawFn) -> Any:
    doc: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(sorted(CONSTANT)), unique=True, max_size=6)):
        value = draw(field(CONSTANT[name]))
        doc[name] = {"value": value, "source": draw(field(st.text(max_size=8)))} if draw(st.booleans()) else value
    if draw(st.booleans()):
        doc["memory"] = draw(field(st.dictionaries(st.sampled_from(MEMORY_KEYS), field(NUMBER), max_size=3)))
    if draw(st.booleans()):
        doc["match"] = draw(field(st.fixed_dictionaries({"gpu": field(st.just("H200")),
                                                         "vllm_version": field(st.just("0.26.0"))})))
    if draw(st.integers(0, 9)) == 0:
        doc[draw(st.sampled_from(["fit", "notes", "bogus"]))] = draw(JUNK)
    return draw(st.one_of(st.just(doc), st.just(doc), JUNK))


@settings(FUZZ, max_examples=100)
@given(doc=profiles())
def test_generated_calibration_profiles_are_read_or_refused_in_one_line(doc):
    _check(read_calibration, _dump(doc), need_line=False)


GPU_FIELD = {
    "memory_gib": st.one_of(st.floats(-1, 20_000), NUMBER),
    "hbm_bandwidth_gbs": NUMBER,
    "fp16_tflops": NUMBER,
    "int8_tops": st.one_of(st.none(), NUMBER),
    "compute_capability": st.sampled_from(["9.0", "8.9", 7.5, "10", "a.b", "-1.5", "100.0"]),
    "interconnect": st.sampled_from(["nvlink", "pcie", "NVLink", "ib"]),
    "link_bandwidth_gbs": NUMBER,
    "pcie_gen": st.integers(-1, 9),
    "source": st.text(max_size=8),
    "device_name": st.text(max_size=8),
    "aliases": st.lists(st.sampled_from(["x", 4090, "", True]), max_size=3),
    "fp8": st.booleans(),
    "bogus": st.integers(),
}


@st.composite
def catalogs(draw: st.DrawFn) -> Any:
    out: dict[Any, Any] = {}
    for name in draw(st.lists(st.sampled_from(["MY-GPU", "H100-SXM", "7", ""]), unique=True, max_size=2)):
        keys = draw(st.lists(st.sampled_from(sorted(GPU_FIELD)), unique=True, min_size=6))
        out[name] = draw(field(st.fixed_dictionaries({k: field(GPU_FIELD[k]) for k in keys})))
    return draw(st.one_of(st.just(out), st.just(out), JUNK))


@settings(FUZZ, max_examples=100)
@given(doc=catalogs())
def test_generated_gpu_catalogs_are_read_or_refused_in_one_line(doc):
    _check(read_catalog, _dump(doc), need_line=False)


# -- through the command line ------------------------------------------------------------------
@pytest.mark.parametrize(("old", "new", "line"), [
    ("gpus: 1  ", "gpus: 1000000  ", 13),
    ("requests: 1000", "requests: 1e15", 20),
    ("model: qwen2.5-7b", "model: 7", 11),
    ("seed: 0", "seed: -1", 23),
])
def test_search_refuses_a_bad_space_in_one_line_with_its_line(old, new, line, tmp_path, monkeypatch, capsys):
    from tuner.cli import main

    text = (SPACES_DIR / "default.yaml").read_text()
    assert text.splitlines()[line - 1].lstrip().startswith(old.split(":")[0] + ":")
    monkeypatch.chdir(tmp_path)
    Path("bad.yaml").write_text(text.replace(old, new, 1))
    with pytest.raises(SystemExit) as exit_:
        main(["search", "--space", "bad.yaml", "--budget", "1"])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == ""
    assert err.startswith(f"tuner: bad.yaml:{line}: ") and err.count("\n") == 1, err
    assert not list(tmp_path.glob("studies/*.db"))  # refused before any study was made
