"""Faults staged the way sites stage them (issue 48): launchers that wrap the server in
coreutils ``timeout`` or daemonize it, a server paused (SIGSTOP/SIGCONT) or stopped by
someone else mid-replay, an API that answers 503 while it warms up, failures that name a
knob's value, carry a per-start id or strike 30 % of starts at random (during the search
and the confirmation race), a study file deleted mid-study or empty, a quiet night, a
password in every command's storage URL, a bad ``--seed``, a trace too large for the
window, a request no max-model-len holds, an endpoint study's serve command, a file-size
limit. Each returns an :class:`scenarios.Outcome`; ``tests/faults/test_staged.py`` asserts
them and ``python benchmarks/faults.py`` prints them with the rest.
"""
from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import scenarios as sc

FAULTY = sc.REPO / "tests" / "faults" / "faulty.py"
#: The sim-serve command a site's launcher script runs (its arguments follow).
SERVE = f"{sys.executable} -m tuner sim-serve --speed 50"


def faulty(fault: str, *opts: str) -> str:
    """A ``--vllm-cmd`` running tests/faults/faulty.py's ``fault`` in front of sim-serve."""
    return f"{sys.executable} {FAULTY} --fault {fault} {' '.join(opts)} sim-serve --speed 50"


def ours(folder: Path, owner: int) -> list[psutil.Process]:
    """Processes of the scenario still running: tuner-marked ones of ``owner`` (whatever
    launched them), and any other whose working folder is the scenario's (a ``tail -f``)."""
    found = {p.pid: p for p in sc.marked(owner)}
    for p in psutil.process_iter(["pid", "cwd", "status"]):
        with contextlib.suppress(psutil.Error):
            if p.info["cwd"] and str(p.info["cwd"]).startswith(str(folder)) and p.pid != os.getpid() \
                    and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.setdefault(p.pid, p)
    return list(found.values())


def left_after(folder: Path, owner: int) -> int:
    """How many of :func:`ours` run when tuner ``owner`` has exited (call it at once: a
    server a run leaves is stale, and any ``tuner search`` on this host stops stale servers,
    so a later look could miss it); they are killed (a scenario must not leave them to the
    next, nor to the machine)."""
    left = [p for p in ours(folder, owner) if p.pid != owner]
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return len(left)


def _token(proc: psutil.Process) -> str | None:
    """The server token of a tuner-marked process (one per replica, shared by its launcher)."""
    try:
        return proc.environ().get("TUNER_SERVER", "").rpartition(":")[2] or None
    except psutil.Error:
        return None


def fake_nvidia_smi(folder: Path) -> dict[str, str]:
    """``folder/bin/nvidia-smi`` that says GPU 0 is held by every sim-serve process run from
    ``folder`` (40 GB each), as nvidia-smi would list vLLM servers; the environment for tuner
    with it first on PATH."""
    bindir = folder / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    smi = bindir / "nvidia-smi"
    smi.write_text(f"""#!{sys.executable}
import sys, psutil
args = " ".join(sys.argv[1:])
if "--query-gpu" in args:
    print("0, GPU-fake-0")
elif "--query-compute-apps" in args:
    for p in psutil.process_iter(["pid", "cmdline", "cwd"]):
        try:
            if p.info["cwd"] == {str(folder)!r} and "sim-serve" in " ".join(p.info["cmdline"] or []):
                print(f"GPU-fake-0, {{p.pid}}, python, 40960")
        except psutil.Error:
            pass
""")
    smi.chmod(0o755)
    return {**sc.env(), "PATH": f"{bindir}:{os.environ.get('PATH', '')}"}


LAUNCHERS = {
    "timeout": ("#!/bin/bash\n# the server gets at most 6 hours, then SIGTERM (and SIGKILL 30 s later)\n"
                f"timeout --kill-after=30s 6h {SERVE} \"$@\"\n"),
    "daemon": ("#!/bin/bash\n# the server daemonized (its own session, immune to hangups), its log followed\n"
               "log=\"$PWD/server-$$.log\"\n"
               f"setsid nohup {SERVE} \"$@\" > \"$log\" 2>&1 < /dev/null &\n"
               "tail -n +1 -f \"$log\"\n"),
}


def launcher(folder: Path, kind: str) -> Outcome:
    """A site's launcher script as ``--vllm-cmd`` (``timeout``: the server under coreutils
    ``timeout``, in a process group of its own; ``daemon``: setsid + nohup, then ``tail -f``
    of its log), on a host whose nvidia-smi lists the servers: every server stopped after
    every trial and at the exit (found by the marker), none taken for a foreign GPU holder,
    every configuration measured, exit 0."""
    sc.prepare(folder)
    script = folder / f"launch-{kind}.sh"
    script.write_text(LAUNCHERS[kind])
    script.chmod(0o755)
    environment = fake_nvidia_smi(folder)
    peak = [0]
    proc = sc.tuner(folder, *sc.search_args(vllm_cmd=str(script)), env=environment)

    def watch() -> bool:  # servers alive at once, during the run: 1 when each is stopped after its trial
        peak[0] = max(peak[0], len({_token(p) for p in sc.marked(proc.pid)} - {None}))
        return proc.poll() is not None

    sc.wait_for(watch, 240, step=0.5)
    code, out, err = sc.finish(proc)
    left = left_after(folder, proc.pid)
    counts = sc.measured_configs(folder)
    ok = (code == 0 and sc.one_line(err) and "gpu_busy" not in err and len(counts) == sc.GRID and left == 0
          and peak[0] <= 1)
    return sc.Outcome(f"launcher: {'timeout 6h vllm' if kind == 'timeout' else 'setsid nohup + tail -f'}",
                      f"exit {code}, {len(counts)}/{sc.GRID} measured, at most {peak[0]} server(s) at once; "
                      f"'{(err.strip().splitlines() or [''])[-1][7:70]}'", 0, sc.finished(folder), left, ok,
                      {"code": code, "stderr": err, "peak": peak[0]})


# -- disrupted measurements ----------------------------------------------------------------
#: A slower study: 48 requests, sim-serve at 20x, so that a replay lasts long enough to be caught.
SLOW = sc.SPACE.replace("requests: 24", "requests: 48")
SLOW_SIM = f"{sys.executable} -m tuner sim-serve --speed 20"
PAUSE_S = 20.0


def _decoding(server: psutil.Process) -> bool:
    """The server streams answers now: its ``/metrics`` counts requests running (a replay's
    requests past their first token: sim-serve emits one each step)."""
    import re
    import urllib.request

    try:
        args = server.cmdline()
        port = args[args.index("--port") + 1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as resp:
            text = resp.read().decode()
    except (psutil.Error, ValueError, IndexError, OSError):
        return False
    m = re.search(r"^vllm:num_requests_running(?:\{[^}]*\})? ([\d.]+)", text, re.M)
    return bool(m and float(m.group(1)) > 0)


def _mid_replay(folder: Path, owner: int) -> psutil.Process | None:
    """A sim-serve server of ``owner`` streaming a replay's answers now, once a trial is stored."""
    if sc.finished(folder) < 1:
        return None
    servers = [p for p in sc.marked(owner) if "sim-serve" in " ".join(p.cmdline())]
    return next((p for p in servers if _decoding(p)), None)


def _disrupted(folder: Path, what: str, act) -> Outcome:
    sc.prepare(folder, SLOW)
    proc = sc.tuner(folder, *sc.search_args(vllm_cmd=SLOW_SIM))
    victim: list[psutil.Process] = []
    sc.wait_for(lambda: bool(victim.append(v) or True) if (v := _mid_replay(folder, proc.pid)) else False, 180,
                step=0.05)
    before = sc.finished(folder)
    if victim:
        act(victim[0])
    code, out, err = sc.finish(proc, timeout=400)
    left = left_after(folder, proc.pid)
    recs = [(t, t.user_attrs) for t in sc.trials(folder) if t.state.name == "COMPLETE"]
    slow = [t.number for t, a in recs for p in a.get("loads") or [] if (p.get("duration_s") or 0) > PAUSE_S * 0.6]
    disconnects = [t.number for t, a in recs if set(a.get("errors") or {}) & {"disconnect", "timeout"}]
    counts = sc.measured_configs(folder)
    infeasible = [t.number for t, a in recs if a.get("feasible") is False]
    # the disruption was seen (and the trial measured again), not missed
    seen = [t.number for t in sc.trials(folder) for f in (t.user_attrs.get("blame") or {}).get("failures") or []
            if "disrupted" in f or "stalled" in f or "exited" in f or "stopped answering" in f]
    ok = (bool(victim) and code == 0 and sc.one_line(err) and len(counts) == sc.GRID and max(counts.values()) == 1
          and not slow and not disconnects and not infeasible and sc.finished(folder) == sc.GRID and left == 0
          and bool(seen))
    return sc.Outcome(what, f"exit {code}; {len(counts)}/{sc.GRID} measured once; {len(seen)} disrupted measurement "
                      f"seen and measured again; stored: {len(slow)} with the pause in a replay, {len(disconnects)} "
                      f"with disconnects, {len(infeasible)} infeasible",
                      before, sc.finished(folder), left, ok,
                      {"code": code, "stderr": err, "slow": slow, "disconnects": disconnects, "caught": bool(victim),
                       "infeasible": infeasible, "seen": seen})


def paused(folder: Path) -> Outcome:
    """The server is paused for 20 s mid-replay (SIGSTOP, then SIGCONT: a host that swapped,
    a debugger): every stream stalls at one instant; the measurement is disrupted, measured
    again on a fresh start, never stored (no stored replay holds the pause)."""
    def act(server: psutil.Process) -> None:
        server.suspend()
        time.sleep(PAUSE_S)
        with contextlib.suppress(psutil.Error):
            server.resume()
    return _disrupted(folder, "server paused 20 s mid-replay", act)


def terminated(folder: Path) -> Outcome:
    """Someone else stops the server mid-replay (SIGTERM; it exits 0): the measurement is
    disrupted and measured again on a fresh start; nothing stored infeasible, nothing counted."""
    return _disrupted(folder, "server SIGTERMed from outside mid-replay", lambda s: s.terminate())


def warming_up(folder: Path) -> Outcome:
    """/health answers while /v1/completions answers 503 for the first 10 s of each start:
    the warm-up waits it out (within the start timeout); every configuration is measured."""
    sc.prepare(folder)
    left: list[int] = []
    code, out, err = sc._run(folder, *sc.search_args(vllm_cmd=faulty("warmup503", "--rate", "10")), left=left)
    counts = sc.measured_configs(folder)
    failed = [t.number for t in sc.trials(folder) if t.state.name == "FAIL"]
    ok = code == 0 and sc.one_line(err) and len(counts) == sc.GRID and not failed and not sum(left)
    return sc.Outcome("503 for 10 s after /health answers", f"exit {code}, {len(counts)}/{sc.GRID} measured, "
                      f"{len(failed)} failed trials", 0, sc.finished(folder), sum(left), ok,
                      {"code": code, "stderr": err, "failed": failed})


# -- failures judged by experiment -------------------------------------------------------------
KNOB_SPACE = sc.SPACE.replace("[16, 64]", "[64, 256, 512]")


def knob_failure(folder: Path) -> Outcome:
    """Every max_num_seqs >= 256 crashes after the engine started, vLLM's line naming the
    value: the configuration's fault, stored with that line; the others are measured; the
    run ends 0 (it once stopped with exit 2, 'common to every configuration')."""
    sc.prepare(folder, KNOB_SPACE)
    left: list[int] = []
    code, out, err = sc._run(folder, *sc.search_args(vllm_cmd=faulty("knob"), budget=6), left=left)
    recs = [t for t in sc.trials(folder) if t.state.name == "COMPLETE" and "repeat_of" not in t.user_attrs]
    blamed = sorted({(t.params["max_num_seqs"], t.params["enforce_eager"]) for t in recs
                     if "max_num_seqs=" in str(t.user_attrs.get("infeasible_reason"))})
    served = sorted({(t.params["max_num_seqs"], t.params["enforce_eager"]) for t in recs
                     if t.user_attrs.get("feasible")})
    ok = (code == 0 and sc.one_line(err) and blamed == [(256, False), (256, True), (512, False), (512, True)]
          and served == [(64, False), (64, True)] and not sum(left))
    return sc.Outcome("every max_num_seqs >= 256 crashes", f"exit {code}; {len(blamed)} configurations stored with "
                      f"vLLM's line, {len(served)} measured", 0, sc.finished(folder), sum(left), ok,
                      {"code": code, "stderr": err, "blamed": blamed, "served": served})


def hexid_failure(folder: Path) -> Outcome:
    """Every start dies with a line carrying a fresh address, handle and pid: the machine's
    fault (no configuration starts): nothing stored as a configuration's, nothing counted,
    exit 2 naming the failure (it once stored all of them infeasible, exit 3)."""
    sc.prepare(folder)
    left: list[int] = []
    code, out, err = sc._run(folder, *sc.search_args(vllm_cmd=faulty("hexid")), left=left)
    stored = [t.number for t in sc.trials(folder) if t.state.name == "COMPLETE"]
    ok = code == 2 and sc.one_line(err) and "NCCL error" in err and not stored and sc.finished(folder) == 0 \
        and not sum(left)
    return sc.Outcome("a per-start hex id in every failure", f"exit {code}, {len(stored)} stored; "
                      f"'{err.strip()[7:80]}...'", 0, sc.finished(folder), sum(left), ok,
                      {"code": code, "stderr": err, "stored": stored})


#: Eight configurations (four max_num_seqs, eager or not).
EIGHT = sc.SPACE.replace("[16, 64]", "[16, 32, 64, 128]")


def transient(folder: Path) -> Outcome:
    """30 % of starts crash at random after the engine started (seeded; a machine's
    transient fault), during the search and the confirmation race: no crash is stored as a
    configuration's result or a candidate's repeat, every configuration is measured, the run
    ends 0 with a recommendation."""
    sc.prepare(folder, EIGHT)
    left: list[int] = []
    state = folder / "faulty"
    cmd = faulty("transient", "--rate", "0.3", "--seed", "1", "--state", str(state))
    code, out, err = sc._run(folder, *sc.search_args("--confirm", "3", vllm_cmd=cmd, budget=8, confirm=True),
                             left=left)
    lines = [ln.split() for ln in (state / "starts").read_text().splitlines()] if (state / "starts").exists() else []
    ended = max((t.datetime_complete.timestamp() for t in sc.trials(folder) if t.datetime_complete), default=0.0)
    phases = {"search": [k for k, at in lines if float(at) <= ended], "race": [k for k, at in lines if float(at) > ended]}  # noqa: E501
    everything = sc.trials(folder) + sc.confirmation_repeats(folder)
    blamed = [t.number for t in everything if "NCCL" in str(t.user_attrs.get("infeasible_reason"))
              or ("NCCL" in str(t.user_attrs.get("fail_reason")) and t.user_attrs.get("fail_kind") == "crash")]
    counts = sc.measured_configs(folder)
    report = json.loads(out) if out.strip().startswith("{") else {}
    reason = str((report.get("recommendation") or {}).get("reason"))
    ok = (code == 0 and sc.one_line(err) and not blamed and len(counts) == 8 and "crash" in phases["search"]
          and "crash" in phases["race"] and "tied with none" not in reason and report.get("recommendation")
          and not sum(left))
    shown = ", ".join(f"{k.count('crash')} of {len(k)} in the {p}" for p, k in phases.items())
    return sc.Outcome("30 % of starts crash (search + race)", f"exit {code}; starts crashed: {shown}; "
                      f"{len(blamed)} stored as a configuration's; {len(counts)}/8 measured", 0,
                      sc.finished(folder), sum(left), ok,
                      {"code": code, "stderr": err, "blamed": blamed, "phases": phases, "reason": reason})


# -- studies that must not vanish -----------------------------------------------------------
def _sqlite_trials(db: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            return conn.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
    except sqlite3.Error:
        return 0


def study_deleted(folder: Path) -> Outcome:
    """The study's SQLite file is deleted mid-study: tuner stops with exit 2 naming what
    happened and keeps what it can (a copy of the study it still had open); the next run
    names the copy instead of starting anew, and with the copy moved back goes on."""
    sc.prepare(folder)
    proc = sc.tuner(folder, *sc.sim_args("--study", "gone", budget=40))
    db = folder / "studies" / "gone.db"
    sc.wait_for(lambda: proc.poll() is not None or _sqlite_trials(db) >= 3, 180, step=0.2)
    before = _sqlite_trials(db)
    db.unlink(missing_ok=True)
    code, out, err = sc.finish(proc)
    copies = sorted(p for p in folder.glob("studies/gone*.db") if p.name != "gone.db")  # what tuner saved, if anything
    saved = max((_sqlite_trials(p) for p in copies), default=0)
    rcode, _, rerr = sc.finish(sc.tuner(folder, *sc.sim_args("--study", "gone", budget=40)))
    back = 0
    if copies:
        copies[0].rename(db)
        bcode, _, _ = sc.finish(sc.tuner(folder, *sc.sim_args("--study", "gone", budget=before + 2)))
        back = _sqlite_trials(db) if bcode == 0 else 0
    ok = (code == 2 and sc.one_line(err) and "deleted" in err and saved >= before and rcode == 2
          and sc.one_line(rerr) and back >= before + 2)
    return sc.Outcome("study file deleted mid-study", f"exit {code}: '{err.strip()[7:80]}...'; {saved} trials kept; "
                      f"next run exit {rcode}; moved back: {back} trials", before, back, 0, ok,
                      {"code": code, "stderr": err, "rerun": (rcode, rerr), "copies": [str(p) for p in copies]})


def broken_nightly_study(folder: Path) -> Outcome:
    """``tuner nightly`` on a study file that is empty (0 bytes: a disk that filled, a copy
    cut short) or not SQLite: exit 2, one line naming the file; never a silent first night."""
    sc.prepare(folder)
    (folder / "studies").mkdir()
    results = {}
    for what, data in (("empty", b""), ("garbage", b"this is not a database\n" * 50)):
        path = folder / "studies" / f"{what}.db"
        path.write_bytes(data)
        code, out, err = sc.finish(sc.tuner(folder, "nightly", "--space", "space.yaml", "--trials", "1",
                                            "--storage", f"sqlite:///studies/{what}.db", "--study", what))
        results[what] = (code, out, err, path.read_bytes() == data)
    ok = all(c == 2 and sc.one_line(e) and f"{w}.db" in e and "first night" not in o and same
             for w, (c, o, e, same) in results.items())
    return sc.Outcome("nightly on a 0-byte / non-SQLite study", "; ".join(
        f"{w}: exit {c}, '{e.strip()[7:60]}...'" for w, (c, _, e, _) in results.items()), 0, 0, 0, ok,
        {"results": results})


def efbig(folder: Path) -> Outcome:
    """The study file reaches the process's file-size limit (``ulimit -f``: EFBIG): one
    line naming the limit (not 'read-only, or the database server went away'); the file
    passes integrity_check."""
    import resource

    sc.prepare(folder)
    limit = 1500 * 1024

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.Popen([sys.executable, "-m", "tuner", *sc.sim_args("--study", "big", budget=60)], cwd=folder,
                            env=sc.env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=small_files)
    code, out, err = sc.finish(proc, timeout=400)
    db = folder / "studies" / "big.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
    ok = code == 2 and sc.one_line(err) and "file size limit" in err and "read-only" not in err and integrity == "ok"
    return sc.Outcome("study file hits ulimit -f (EFBIG)", f"exit {code}: '{err.strip()[7:90]}...'; integrity "
                      f"{integrity}", None, _sqlite_trials(db), 0, ok, {"code": code, "stderr": err})


Outcome = sc.Outcome
