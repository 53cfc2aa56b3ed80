"""``tuner doctor``: what tuner has left on this host, and whether its studies are sound.

:func:`diagnose` looks at four things and returns them as one :class:`Diagnosis`:

* **servers**: processes carrying tuner's marker (:mod:`tuner.runtime.processes`), with their
  owner; those whose owner is gone are *stale* (a run killed with SIGKILL, a lost
  session) and :func:`stop_stale` stops them.
* **runs**: ``tuner`` processes running now (search, nightly, plan, calibrate).
* **GPU holders**: what ``nvidia-smi`` says holds GPU memory, marked when it is one of
  tuner's servers (or a child of one).
* **studies**: per SQLite study file, ``PRAGMA integrity_check``, RUNNING trials whose
  process is gone (the next ``tuner search`` fails them as interrupted and measures their
  configuration again), leftover lock files, the size of the write-ahead log and the free
  space beside it; a server database (``--storage``) is checked by connecting.
"""
from __future__ import annotations

import shutil
import socket
import sqlite3
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tuner.core.urls import redact
from tuner.runtime.processes import ServerProcess, marked_processes, stop_group
from tuner.study import own_studies
from tuner.study.locks import StudyLock
from tuner.study.sqlite_file import StudyFileFault, check
from tuner.study.storage import optuna_storage

#: Free space under which the studies' disk is reported (a trial writes a few kB; logs more).
LOW_DISK_BYTES = 512 * 2**20


@dataclass
class StudyHealth:
    path: str
    ok: bool
    integrity: str
    studies: list[str] = field(default_factory=list)
    stale_trials: list[str] = field(default_factory=list)   # "study #n (worker)"
    lock_files: list[str] = field(default_factory=list)
    wal_bytes: int = 0
    free_bytes: int | None = None
    problems: list[str] = field(default_factory=list)


@dataclass
class Diagnosis:
    servers: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    gpu_holders: list[dict[str, Any]] = field(default_factory=list)
    studies: list[StudyHealth] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        out = [f"stale server {s['pid']} (group {s['pgid']}): {s['cmdline'][:80]}" for s in self.servers if s["stale"]]
        for st in self.studies:
            out += [f"{st.path}: {p}" for p in st.problems]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"servers": self.servers, "runs": self.runs, "gpu_holders": self.gpu_holders,
                "studies": [asdict(s) for s in self.studies], "notes": self.notes, "problems": self.problems}


def _server_row(p: ServerProcess) -> dict[str, Any]:
    return {"pid": p.pid, "pgid": p.pgid, "owner_pid": p.owner_pid, "host": p.host, "stale": p.stale,
            "started": p.started, "cmdline": p.cmdline}


def _tuner_runs() -> list[dict[str, Any]]:
    me = psutil.Process().pid
    out = []
    for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
        cmd = proc.info.get("cmdline") or []
        if proc.info["pid"] == me or not cmd:
            continue
        words = [c.rsplit("/", 1)[-1] for c in cmd[:4]]
        if ("tuner" in words or ("-m" in cmd[:3] and "tuner" in cmd[:4])) and \
                any(w in cmd for w in ("search", "nightly", "plan", "calibrate")):
            out.append({"pid": proc.info["pid"], "cmdline": " ".join(cmd)[:200],
                        "started": float(proc.info.get("create_time") or 0.0)})
    return out


def _gpu_holders(ours: set[int]) -> tuple[list[dict[str, Any]], str | None]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], "nvidia-smi not found: GPU holders not listed"
    try:
        out = subprocess.run([exe, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"],  # noqa: E501
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return [], f"nvidia-smi failed: {err}"
    rows = []
    for line in out.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        pid = int(parts[0])
        mine = pid in ours
        if not mine:
            try:
                mine = any(a.pid in ours for a in psutil.Process(pid).parents())
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        rows.append({"pid": pid, "process": parts[1], "used_mib": float(parts[2]) if parts[2].replace(".", "").isdigit()
                     else None, "tuner": mine})
    return rows, None


def check_sqlite(db: Path) -> StudyHealth:
    """Integrity, stale RUNNING trials, leftover locks, WAL size and free space of one file;
    an empty or foreign file is named (:func:`tuner.study.sqlite_file.check`)."""

    health = StudyHealth(path=str(db), ok=True, integrity="not checked")
    try:
        check(db)
    except StudyFileFault as err:
        health.ok, health.integrity = False, "not a study"
        health.problems.append(err.message)
        return health
    try:
        health.free_bytes = shutil.disk_usage(db.parent).free
    except OSError:
        pass
    wal = db.with_name(db.name + "-wal")
    health.wal_bytes = wal.stat().st_size if wal.exists() else 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            health.integrity = ";".join(r[0] for r in conn.execute("PRAGMA integrity_check").fetchall())
            names = dict(conn.execute("SELECT study_id, study_name FROM studies").fetchall())
            running = conn.execute(
                "SELECT t.study_id, t.number, a.value_json FROM trials t LEFT JOIN trial_user_attributes a "
                "ON a.trial_id = t.trial_id AND a.key = 'worker' WHERE t.state = 'RUNNING'").fetchall()
    except sqlite3.DatabaseError as err:
        health.ok, health.integrity = False, f"cannot read: {err}"
        health.problems.append(f"cannot read the study file: {err}")
        return health
    health.studies = sorted(names.values())
    if health.integrity != "ok":
        health.ok = False
        health.problems.append(f"integrity_check: {health.integrity[:200]}")
    for study_id, number, worker in running:
        who = (worker or "").strip('"')
        health.stale_trials.append(f"{names.get(study_id, study_id)} #{number} ({who or 'unclaimed'})")
    for lock in sorted(db.parent.glob(db.name + ".*.lock")):
        purpose = lock.name[len(db.name) + 1:-len(".lock")]
        held = StudyLock(f"sqlite:///{db}", "", purpose)
        try:
            free = held.acquire(blocking=False)
        finally:
            held.close()
        health.lock_files.append(f"{purpose} ({'free' if free else 'held by ' + _read(lock)})")
    if running:
        busy = any("held" in x for x in health.lock_files)
        if not busy:  # nobody writes: these trials belong to a dead run
            health.problems.append(f"{len(running)} trial(s) left RUNNING by a run that is gone; the next "
                                   "tuner search on the study fails them as interrupted and measures them again")
    if health.free_bytes is not None and health.free_bytes < LOW_DISK_BYTES:
        health.problems.append(f"{health.free_bytes / 2**20:.0f} MiB free beside the study: free space "
                               f"(old studies/*/logs/) before the next run")
    health.ok = not health.problems
    return health


def _read(path: Path) -> str:
    try:
        return path.read_text().strip() or "another process"
    except OSError:
        return "another process"


def check_storage(url: str) -> StudyHealth:
    """A server database: can it be reached, and which studies does it hold."""
    import optuna

    health = StudyHealth(path=redact(url), ok=True, integrity="server database")
    try:
        store = optuna_storage(url, "")
        health.studies = own_studies(optuna.get_all_study_names(store))
    except Exception as err:  # noqa: BLE001 - any driver error is the finding
        health.ok = False
        health.problems.append(f"cannot open: {type(err).__name__}: {redact(str(err))[:200]}")
    return health


def diagnose(studies_dir: str | Path = "studies", storage: str | None = None) -> Diagnosis:
    """Everything :mod:`tuner.ops.doctor` checks, on this host."""
    d = Diagnosis()
    marked = marked_processes()
    d.servers = [_server_row(p) for p in marked]
    d.runs = _tuner_runs()
    d.gpu_holders, note = _gpu_holders({p.pid for p in marked})
    if note:
        d.notes.append(note)
    if storage:
        d.studies.append(check_storage(storage))
    folder = Path(studies_dir)
    for db in sorted(folder.glob("*.db")):
        d.studies.append(check_sqlite(db))
    if not storage and not folder.is_dir():
        d.notes.append(f"no {folder}/ here: run tuner doctor where you run tuner search, or give --storage")
    d.notes.append(f"host {socket.gethostname()}")
    return d


def stop_stale(diagnosis: Diagnosis) -> list[int]:
    """Stop the stale servers' process groups; returns the groups that are gone."""
    gone = []
    for pgid in sorted({s["pgid"] for s in diagnosis.servers if s["stale"]}):
        if stop_group(pgid):
            gone.append(pgid)
    return gone


__all__ = ["Diagnosis", "StudyHealth", "check_sqlite", "check_storage", "diagnose", "stop_stale"]
