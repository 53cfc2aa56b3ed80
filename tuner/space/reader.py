"""Reading a search space from YAML: the shipped spaces, the file's sections, the deployment
and workload, and the files and names it refers to."""
from __future__ import annotations

import dataclasses
from dataclasses import fields
from pathlib import Path
from typing import Any

from tuner.core.errors import InputError
from tuner.core.units import parse_seconds
from tuner.core.values import is_number, shown
from tuner.core.yamlfile import YamlDoc, parse_yaml, read_yaml
from tuner.serving.config import Deployment
from tuner.serving.slo import SloSet
from tuner.sim.calibration import load_calibration, memory_overrides
from tuner.sim.hardware import get_gpu
from tuner.sim.model import load_model
from tuner.space.checks import check_keys, kind
from tuner.space.knob_values import as_float, numeric, own_message, whole
from tuner.space.parameters import parse_layouts, parse_parameters
from tuner.space.search_space import SearchSpace
from tuner.space.workload import WorkloadSpec

_TOP_KEYS = ("name", "description", "deployment", "workload", "parameters", "layouts")
_DEPLOYMENT_KEYS = {f.name for f in fields(Deployment)} | {"gpus"}
_WORKLOAD_KEYS = ("target_ttft_s", "slos", "trace", "requests", "rate", "load", "seed")

#: Folder of the spaces shipped with the repository.
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "search_spaces"

#: Space names end up in study and file names (255 bytes on most file systems).
MAX_NAME = 100


# -- loading ---------------------------------------------------------------------------
def list_spaces() -> list[Path]:
    """The shipped spaces (``search_spaces/*.yaml``)."""
    return sorted(SHIPPED_DIR.glob("*.yaml"))


def resolve_space_path(name_or_path: str | Path) -> Path:
    """A path as given, else a shipped space by name (``default``, ``article-004-8xv100-32gb``)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    for folder in (Path.cwd() / "search_spaces", SHIPPED_DIR):
        for candidate in (folder / f"{name_or_path}.yaml", folder / str(name_or_path)):
            if candidate.is_file():
                return candidate
    known = ", ".join(p.stem for p in list_spaces()) or "none"
    raise InputError(
        f"no search space {str(name_or_path)!r}",
        hint=f"give a YAML file or a shipped space name: {known}",
    )


def load_space(name_or_path: str | Path = "default", *, trace: str | None = None) -> SearchSpace:
    """Read and validate a search space (a shipped name or a YAML path). ``trace`` (the
    command line's ``--trace``) replaces the space's own before anything is checked, so a
    space whose trace file is missing is still usable with another."""
    path = resolve_space_path(name_or_path)
    return _space_from(read_yaml(path, what="search space"), trace=trace)


def parse_space(text: str, *, path: str = "<space>", trace: str | None = None) -> SearchSpace:
    """Validate the search space in ``text`` (errors name ``path`` and the line)."""
    return _space_from(parse_yaml(text, path=path, what="search space"), trace=trace)


def _from_folder(doc: YamlDoc, value: Any) -> Any:
    """A relative file path written in the space file, resolved from that file's folder
    (not the working directory); anything else as written."""
    if not isinstance(value, str) or not value or doc.path == "<space>":
        return value
    path = Path(value).expanduser()
    return value if path.is_absolute() else str(Path(doc.path).parent / path)


def _space_from(doc: YamlDoc, *, trace: str | None = None) -> SearchSpace:
    path, data = doc.path, doc.data
    default_name = Path(path).stem if path != "<space>" else "space"
    stub = SearchSpace(default_name, Deployment(), WorkloadSpec(), path=path, lines=doc.lines)
    if not isinstance(data, dict):
        raise stub.error(f"a search space is a mapping of keys, this file holds {kind(data)}", (),
                         hint="see search_spaces/default.yaml")
    check_keys(stub, data, _TOP_KEYS, ())
    name = _text(stub, data.get("name"), ("name",), limit=MAX_NAME) or default_name
    description = _text(stub, data.get("description"), ("description",), limit=10_000)
    deployment = _parse_deployment(stub, _section(data, "deployment"))
    workload = _parse_workload(stub, _section(data, "workload"))
    if trace is not None:  # --trace: the space's own is never read (nor checked)
        workload = dataclasses.replace(workload, trace=trace)
    elif workload.trace is not None:
        workload = dataclasses.replace(workload, trace=_from_folder(doc, workload.trace))
    if deployment.calibration is not None:
        deployment = dataclasses.replace(deployment, calibration=_from_folder(doc, deployment.calibration))
    params, fixed = parse_parameters(stub, _section(data, "parameters"))
    layouts = parse_layouts(stub, data.get("layouts", "auto"))
    # a trace the caller gave is the caller's to answer for (its reader names the file), not the space's line
    _check_references(stub, deployment, workload if trace is None else dataclasses.replace(workload, trace=None))
    return SearchSpace(
        name=name,
        deployment=deployment,
        workload=workload,
        params=params,
        fixed=fixed,
        layouts=layouts,
        description=description,
        path=path,
        lines=doc.lines,
    )


def _section(data: dict[Any, Any], key: str) -> Any:
    """A section's mapping; an absent or empty one (``workload:``) is ``{}``."""
    value = data.get(key)
    return {} if value is None else value


def _text(space: SearchSpace, value: Any, where: tuple[Any, ...], *, limit: int) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise space.error(f"must be text, got {shown(value)}", where)
    text = str(value)
    if len(text) > limit:
        raise space.error(f"is {len(text):,} characters long, more than {limit:,}", where,
                          hint="keep it short: it becomes part of study names" if limit == MAX_NAME else None)
    return text


def _parse_deployment(space: SearchSpace, data: Any) -> Deployment:
    check_keys(space, data, _DEPLOYMENT_KEYS, ("deployment",))
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = "gpu_count" if key == "gpus" else key
        where = ("deployment", key)
        if name == "gpu_ids":
            if value is None:
                value = ()
            elif not isinstance(value, list):
                raise space.error(f"must be a list of device ids, got {shown(value)}", where, hint="e.g. gpu_ids: [0, 1]")  # noqa: E501
            value = tuple(value)
            probe: dict[str, Any] = {"gpu_ids": value, "gpu_count": max(len(value), 1)}
        else:
            probe = {name: value}
        try:  # one field at a time, so that the message points at its line
            Deployment(**probe)
        except InputError as err:
            raise space.error(own_message(err.message, name), where, hint=err.hint) from err
        values[name] = value
    try:
        return Deployment(**values)
    except InputError as err:
        where = ("deployment", "gpu_ids") if "gpu_ids" in data else ("deployment",)
        raise space.error(err.message, where, hint=err.hint) from err


def _parse_workload(space: SearchSpace, data: Any) -> WorkloadSpec:
    check_keys(space, data, _WORKLOAD_KEYS, ("workload",))
    values: dict[str, Any] = {}
    target, slos = data.get("target_ttft_s"), data.get("slos") or []
    for name, value in data.items():
        where = ("workload", name)
        try:
            if name == "target_ttft_s":
                WorkloadSpec(slo=SloSet.ttft(parse_seconds(value, what="target_ttft_s")))
                continue
            if name == "slos":
                if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
                    raise InputError(f"must be a list of SLOs such as [p99:tpot<=30ms], got {shown(value)}")
                SloSet.parse(value)
                continue
            if name in ("requests", "seed", "rate"):
                value = numeric(value)
                if not is_number(value):
                    raise InputError(f"must be a number, got {shown(value)}")
                value = as_float(value) if name == "rate" else whole(value)
            WorkloadSpec(**{name: value})
        except InputError as err:
            raise space.error(own_message(err.message, name), where, hint=err.hint) from err
        values[name] = value
    try:  # the space's service levels, read once: its target and its slos, P95 TTFT first
        # a P95 TTFT SLO among slos is the target (as --slo p95:ttft is --target-ttft)
        target_s = 2.0 if target is None else parse_seconds(target, what="target_ttft_s")
        found = SloSet.parse(slos)
        return WorkloadSpec(slo=found.or_target(target_s) if found else SloSet.ttft(target_s), **values)
    except InputError as err:
        raise space.error(own_message(err.message, "slos"), ("workload", "slos" if "slos" in data else "target_ttft_s"),
                          hint=err.hint) from err


def _check_references(space: SearchSpace, deployment: Deployment, workload: WorkloadSpec) -> None:
    """The files and names the space refers to exist: model, GPU, calibration profile and
    trace (a problem inside one of those files is reported at that file's own line)."""

    def check(key: tuple[str, str], call: Any) -> Any:
        try:
            return call()
        except InputError as err:
            if err.path is not None:  # the referenced file's own fault, with its own line
                raise
            raise space.error(err.message, key, hint=err.hint) from err

    check(("deployment", "model"), lambda: load_model(deployment.model))
    gpu = check(("deployment", "gpu"), lambda: get_gpu(deployment.gpu))
    if deployment.calibration is not None:
        if not Path(deployment.calibration).expanduser().is_file():
            raise space.error(f"no calibration profile {deployment.calibration!r}", ("deployment", "calibration"),
                              hint="give the path of a profile.yaml (tuner calibrate writes one)")
        check(("deployment", "calibration"), lambda: load_calibration(gpu, deployment.calibration))
        check(("deployment", "calibration"),
              lambda: memory_overrides(gpu.name, deployment.vllm_version, deployment.calibration))
    if workload.trace is not None and not Path(workload.trace).expanduser().is_file():
        raise space.error(f"no such file {workload.trace!r} (a relative path is read from the space file's folder)",
                          ("workload", "trace"),
                          hint="give the path of a request log, or null for the synthetic mix; or --trace FILE")


