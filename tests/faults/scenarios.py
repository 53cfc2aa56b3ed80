"""Faults an unattended ``tuner search`` meets, each staged with real processes on loopback:
``tuner sim-serve`` as the vLLM command, stand-in servers, a small tmpfs, signals.

Each scenario runs in its own folder and returns an :class:`Outcome`: what happened, the
study's finished trials before and after the fault (and after a rerun where one belongs),
the tuner-marked processes left running (must be 0) and the verdict. ``tests/faults/``
asserts them one by one; ``python benchmarks/faults.py`` prints them as one table.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[2]
#: A small grid: 4 configurations, short outputs, sim-serve 50x real time: a trial takes ~1-3 s.
SPACE = """\
name: faults
deployment: {model: qwen2.5-7b, gpu: H100-SXM, gpus: 1}
workload: {target_ttft_s: 2s, requests: 24}
parameters:
  max_num_seqs: {choices: [16, 64]}
  max_model_len: 4096
  enforce_eager: {choices: [false, true]}
layouts: [tp1x1]
"""
GRID = 4
SIM = f"{sys.executable} -m tuner sim-serve --speed 50"


@dataclass
class Outcome:
    fault: str
    happened: str
    before: int | None = None       # finished trials when the fault struck
    after: int | None = None        # finished trials once the run ended (and a rerun, if any)
    left: int = 0                   # tuner-marked processes still running
    ok: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    def row(self) -> tuple[str, str, str, str, str]:
        fmt = lambda v: "-" if v is None else str(v)  # noqa: E731
        return (self.fault, self.happened, f"{fmt(self.before)} -> {fmt(self.after)}", str(self.left),
                "survived" if self.ok else "FAILED")


# -- helpers ------------------------------------------------------------------------------
def env() -> dict[str, str]:
    """The environment of tuner's processes here (no API key of the person running them)."""
    keep = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "VLLM_API_KEY")}
    return {**keep, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def tuner(folder: Path, *args: str, **kw: Any) -> subprocess.Popen:
    """``python -m tuner ARGS`` in ``folder`` (its own session: a signal to it reaches only it);
    ``env=`` replaces :func:`env`."""
    environment = kw.pop("env", None) or env()
    return subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=folder, env=environment, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **kw)


def search_args(*extra: str, vllm_cmd: str = SIM, budget: int = GRID, confirm: bool = False) -> list[str]:
    """A grid study on ``vllm_cmd``. The winner's confirmation (repeats after the budget) is
    off unless asked for: the faults strike the budget's trials, and an interrupted
    confirmation has its own test (tests/test_confirmation.py)."""
    return ["search", "--space", "space.yaml", "--backend", "vllm", "--vllm-cmd", vllm_cmd, "--sampler", "grid",
            "--budget", str(budget), "--no-predict", "--output", "json", *([] if confirm else ["--confirm", "0"]),
            *extra]


def prepare(folder: Path, space: str = SPACE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "space.yaml").write_text(space)
    return folder


def study_db(folder: Path) -> Path | None:
    dbs = sorted((folder / "studies").glob("*.db"))
    return dbs[0] if dbs else None


def study_in(folder: Path) -> Any:
    """The study of the folder's database (not its companion, tuner.study.confirmation_study), or None."""
    import optuna

    from tuner.study import own_studies

    db = study_db(folder)
    if db is None or not _created(db):
        return None
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = _storage(db)
    names = own_studies(optuna.get_all_study_names(storage))
    return optuna.load_study(study_name=names[0], storage=storage) if names else None  # None while being created


_STORAGES: dict[tuple[str, int], Any] = {}


def _created(db: Path) -> bool:
    """Whether tuner has finished creating the database's tables (read with sqlite3,
    read-only: opening it with Optuna while tuner creates it would race its creation)."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            return conn.execute("SELECT count(*) FROM alembic_version").fetchone()[0] > 0
    except sqlite3.Error:
        return False


def _storage(db: Path) -> Any:
    """One Optuna storage per database file (the same path re-created is another file): the
    scenarios poll the study while tuner runs, and a storage opened per look costs ~80 ms of
    CPU that the processes under test need. It reads afresh every time (no cache of its own)."""
    import optuna

    key = (str(db), db.stat().st_ino)
    if key not in _STORAGES:
        _STORAGES.clear()  # one study at a time: the previous scenario's is done with
        _STORAGES[key] = optuna.storages.RDBStorage(f"sqlite:///{db}")
    return _STORAGES[key]


def trials(folder: Path) -> list[Any]:
    study = study_in(folder)
    return [] if study is None else study.get_trials(deepcopy=False)


def confirmation_repeats(folder: Path) -> list[Any]:
    """The confirmation's repeats (the companion's trials: tuner.study.repeats)."""
    from tuner.study import repeats

    study = study_in(folder)
    return [] if study is None else repeats(study, f"sqlite:///{study_db(folder)}")


def finished(folder: Path) -> int:
    """Trials that count against the budget, as tuner counts them (tuner.study.count_finished):
    confirmation re-measurements of the best (outside the budget), failures that measured
    nothing and copies of a configuration measured before (free up to FREE_COPIES) left out."""
    from optuna.trial import TrialState

    from tuner.study import counts_toward_budget, free_copies, is_copy

    counted = [t for t in trials(folder) if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
               and counts_toward_budget(t)]
    return len(counted) - free_copies(sum(1 for t in counted if is_copy(t)))


def measured_configs(folder: Path) -> collections.Counter:
    """COMPLETE trials of the budget per configuration: repeats of an earlier result and the
    confirmation's re-measurements of the best (``confirm_of``, outside the budget) left out."""
    from optuna.trial import TrialState

    from tuner.study import is_confirmation

    return collections.Counter(tuple(sorted(t.params.items())) for t in trials(folder)
                               if t.state == TrialState.COMPLETE and "repeat_of" not in t.user_attrs
                               and not is_confirmation(t))


def marked(owner: int | None = None) -> list[psutil.Process]:
    """Live processes carrying tuner's marker (of ``owner``, when given)."""
    from tuner.runtime.processes import marked_processes

    out = []
    for p in marked_processes():
        if owner is None or p.owner_pid == owner:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc = psutil.Process(p.pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
    return out


def wait_for(pred, timeout: float = 120.0, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return False


def wait_gone(owner: int | None, timeout: float = 30.0) -> int:
    wait_for(lambda: not marked(owner), timeout)
    return len(marked(owner))


def one_line(stderr: str) -> bool:
    """tuner's contract: messages are lines starting 'tuner:', never a traceback."""
    return "Traceback" not in stderr and all(line.startswith("tuner:") for line in stderr.splitlines() if line.strip())


def finish(proc: subprocess.Popen, timeout: float = 240.0) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return proc.returncode, out, err


# -- scenarios ----------------------------------------------------------------------------
def stop_signal(folder: Path, sig: signal.Signals) -> Outcome:
    """A signal while a trial's server runs: exit 128+n, one line, the server stopped, the
    trial FAIL 'interrupted' and not counted; the rerun measures every configuration once."""
    prepare(folder)
    proc = tuner(folder, *search_args())
    started = wait_for(lambda: len(marked(proc.pid)) > 0 and finished(folder) >= 1)
    before = finished(folder)
    proc.send_signal(sig)
    code, _, err = finish(proc)
    left = wait_gone(proc.pid, timeout=45)
    interrupted = [t for t in trials(folder) if t.user_attrs.get("fail_kind") == "interrupted"]
    rerun = tuner(folder, *search_args())
    rcode, rout, rerr = finish(rerun)
    counts = measured_configs(folder)
    expected = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}[sig]
    ok = (started and code == expected and one_line(err) and "interrupted by" in err and left == 0
          and len(interrupted) == 1 and rcode == 0 and len(counts) == GRID and max(counts.values()) == 1
          and finished(folder) == GRID and not marked(rerun.pid))
    return Outcome(f"{sig.name} mid-trial", f"exit {code}, '{err.strip()[:60]}...'; rerun exit {rcode}, "
                   f"{len(counts)}/{GRID} configurations measured once", before, finished(folder), left, ok,
                   {"code": code, "stderr": err, "rerun_code": rcode, "rerun_stderr": rerr, "counts": counts,
                    "interrupted": len(interrupted)})


def sigkill(folder: Path) -> Outcome:
    """SIGKILL (nothing can be handled): the kernel stops the server (PR_SET_PDEATHSIG); the
    rerun fails the trial left RUNNING as interrupted, says so, and measures every configuration."""
    prepare(folder)
    proc = tuner(folder, *search_args())
    started = wait_for(lambda: len(marked(proc.pid)) > 0 and finished(folder) >= 1)
    before = finished(folder)
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    left = wait_gone(proc.pid, timeout=30)
    rerun = tuner(folder, *search_args(confirm=True))  # the winner's repeats on fresh servers, after the repair
    rcode, _, rerr = finish(rerun)
    counts = measured_configs(folder)
    leftover = [t for t in trials(folder) if "left RUNNING" in str(t.user_attrs.get("fail_reason"))]
    ok = (started and left == 0 and rcode == 0 and "left RUNNING" in rerr and len(leftover) == 1
          and len(counts) == GRID and max(counts.values()) == 1)
    return Outcome("SIGKILL mid-trial", f"server gone with tuner; rerun: '{rerr.strip()[:50]}...', "
                   f"{len(counts)}/{GRID} measured", before, finished(folder), left, ok,
                   {"rerun_stderr": rerr, "counts": counts})


def wrapper(folder: Path, cleanup_s: float = 0) -> str:
    """A launcher script that does not ``exec`` the server (it waits, then reports), as
    site launchers do: the server is tuner's grandchild, the shell its direct child. With
    ``cleanup_s``, it cleans up that long before it reports (as a busy host delays any launcher)."""
    script = folder / "launch.sh"
    script.write_text(f"#!/bin/bash\n{SIM} \"$@\"\nstatus=$?\nsleep {cleanup_s:g}\n"
                      "echo \"launch.sh: server exited $status\"\nexit $status\n")
    script.chmod(0o755)
    return str(script)


def servers_of(owner: int) -> list[psutil.Process]:
    """The marked server processes (not their launcher shells) of tuner ``owner``."""
    return [p for p in marked(owner) if "sim-serve" in " ".join(p.cmdline()) and "launch.sh" not in " ".join(p.cmdline())]  # noqa: E501


def wrapper_sigkill(folder: Path) -> Outcome:
    """SIGKILL of tuner while its server runs behind a launcher that does not exec: the
    reaper stops the whole group (PDEATHSIG alone reaches only the shell); the rerun measures
    every configuration."""
    prepare(folder)
    cmd = wrapper(folder)
    proc = tuner(folder, *search_args(vllm_cmd=cmd))
    started = wait_for(lambda: len(servers_of(proc.pid)) > 0 and finished(folder) >= 1)
    before = finished(folder)
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    left = wait_gone(proc.pid, timeout=60)
    rcode, _, rerr = finish(tuner(folder, *search_args(vllm_cmd=cmd)))
    counts = measured_configs(folder)
    ok = started and left == 0 and rcode == 0 and len(counts) == GRID and max(counts.values()) == 1
    return Outcome("SIGKILL, server behind a wrapper", f"{left} left; rerun exit {rcode}, {len(counts)}/{GRID} "
                   "measured", before, finished(folder), left, ok, {"rerun_stderr": rerr, "counts": counts})


def killed_from_outside(folder: Path, times: int, sampler: str = "grid", cleanup_s: float = 0) -> Outcome:
    """The server (behind a wrapper that does not exec, which reports ``cleanup_s`` after its
    server ended) is SIGKILLed by someone else mid-trial, ``times`` times in a row: once, the
    trial is measured again and the run ends 0 with every configuration measured; twice, the
    run stops with exit 2 and one line naming the signal. Never stored infeasible, never counted."""
    prepare(folder)
    launcher = wrapper(folder, cleanup_s)
    proc = tuner(folder, *[a if a != "grid" else sampler for a in search_args(vllm_cmd=launcher)])
    killed: list[int] = []

    def serving(server: psutil.Process) -> bool:  # mid-trial: the replay holds a connection to it now
        try:
            # psutil 6 renamed connections() to net_connections(); pyproject allows 5.9
            conns = getattr(server, "net_connections", None) or server.connections
            conns = conns(kind="tcp")
        except psutil.Error:
            return False
        return any(c.status == psutil.CONN_ESTABLISHED for c in conns)

    def victim() -> psutil.Process | None:  # a server of a trial after the first is stored, while it serves
        # A kill that lands after the trial was measured (the server already being stopped) is
        # no fault of anyone: on a busy machine "a server is up" is not "a trial is running".
        # The replay of a trial lasts about a second; a busy machine can let every window pass
        # between two looks, so the last trial's server is killed at first sight (mid-start,
        # as tuner sees it the same fault): the kill always lands on a trial in progress.
        fresh = [p for p in servers_of(proc.pid) if p.pid not in killed]
        done = finished(folder) if fresh else 0  # a server up: the study exists
        return fresh[0] if done >= 1 and (done >= GRID - 1 or serving(fresh[0])) else None

    def kill_one() -> bool:  # find and kill in one look: on a busy machine the run moves on between two
        server = victim()
        if server is None:
            return False
        try:
            server.kill()
        except psutil.NoSuchProcess:  # it ended on its own first: not killed from outside, wait for the next
            return False
        killed.append(server.pid)
        return True

    for _ in range(times):
        if not wait_for(kill_one, 120):
            break
    code, _, err = finish(proc)
    left = wait_gone(proc.pid, timeout=45)
    recs = trials(folder)
    env_faults = [t for t in recs if t.user_attrs.get("fail_kind") == "environment"]
    infeasible_env = [t for t in recs if "SIGKILL" in str(t.user_attrs.get("infeasible_reason", ""))]
    counts = measured_configs(folder)
    if times == 1:
        remeasured = all(any(t.state.name == "COMPLETE" and t.params == f.params and t.user_attrs.get("repeat_of") is None  # noqa: E501
                             for t in recs) for f in env_faults)
        ok = (len(killed) == 1 and code == 0 and finished(folder) == GRID and len(env_faults) == 1 and remeasured
              and (sampler != "grid" or len(counts) == GRID) and not infeasible_env and left == 0
              and all("killed" in str(t.user_attrs.get("fail_reason")) for t in env_faults))
        happened = f"exit {code}; {len(env_faults)} trial measured again, {len(counts)}/{GRID} measured"
    else:
        ok = (code == 2 and one_line(err) and "SIGKILL" in err and "in a row" in err and not infeasible_env
              and left == 0)
        last = (err.strip().splitlines() or [""])[-1]
        happened = f"exit {code}: '{last[:90]}...'"
    return Outcome(f"server killed from outside x{times} ({sampler})", happened, None, finished(folder), left, ok,
                   {"stderr": err, "code": code, "killed": killed, "env_faults": len(env_faults)})


def positional_model(folder: Path) -> Outcome:
    """``--vllm-cmd "vllm serve --load-format dummy"`` with a stub ``vllm`` that refuses, in
    vLLM 0.26's own words, flags before the model: tuner puts the model right after ``serve``,
    so every configuration is measured. A stub whose every start dies that way before the
    engine starts stops the run with exit 2, nothing stored infeasible."""
    prepare(folder)
    stub = folder / "vllm"
    stub.write_text(f"""#!{sys.executable}
import os, sys
args = sys.argv[1:]
if args[0] != "serve":
    sys.exit("vllm: only serve here")
if len(args) > 1 and args[1].startswith("-") and any(a.startswith("--served-model-name") for a in args):
    print("Traceback (most recent call last):", file=sys.stderr)
    print("ValueError: `model` should be provided as the first positional argument when using `vllm serve`. "
          "i.e. `vllm serve <model> --<arg> <value>`.", file=sys.stderr)
    sys.exit(1)
rest = args[1:]
if "--load-format" in rest:
    i = rest.index("--load-format")
    del rest[i:i + 2]
os.execv(sys.executable, [sys.executable, "-m", "tuner", "sim-serve", "--speed", "50", *rest])
""")
    stub.chmod(0o755)
    left: list[int] = []
    code, _, err = _run(folder, *search_args(vllm_cmd=f"{stub} serve --load-format dummy"), left=left)
    counts = measured_configs(folder)
    # the same refusal for every start: what tuner did before (flags, then the model), staged by hand
    other = folder / "bad"
    prepare(other)
    bcode, _, berr = _run(other, *search_args(vllm_cmd=f"{stub} serve --load-format dummy {{model}}"), left=left)
    bad = trials(other)
    ok = (code == 0 and len(counts) == GRID and bcode == 2 and one_line(berr) and "before vLLM's engine" in berr
          and [t.user_attrs.get("fail_kind") for t in bad] == ["environment"] * 2
          and not any(t.user_attrs.get("infeasible_reason") for t in bad) and not sum(left))
    return Outcome("vllm serve + flags (0.26 refusal text)", f"exit {code}, {len(counts)}/{GRID} measured; flags "
                   f"before the model: exit {bcode}, 0 stored", 0, finished(folder), sum(left), ok,
                   {"stderr": err, "bad_stderr": berr})


def stale_server(folder: Path) -> Outcome:
    """A server a dead run left (marker with a gone owner) is listed by doctor and stopped
    by the next search before it starts anything (it is provably tuner's); an unmarked
    bystander is never touched."""
    prepare(folder)
    dead_owner = 2**22 + 12345
    server = start_listening([sys.executable, "-m", "tuner", "sim-serve", "qwen2.5-7b", "--max-model-len", "4096"],
                             env={**env(), "TUNER_SERVER": f"{socket.gethostname()}:{dead_owner}:stale"})
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    try:
        dcode, dout, _ = finish(tuner(folder, "doctor", "--output", "json"))
        listed = any(s["stale"] and s["pid"] == server.pid for s in json.loads(dout)["servers"])
        code, _, err = finish(tuner(folder, *search_args(budget=1)))
        stopped = wait_for(lambda: server.poll() is not None, 20)
        steps = {"doctor exit 1": dcode == 1, "listed": listed, "search exit 0": code == 0,
                 "said so": "stopped a server left by a dead run" in err, "stopped": stopped,
                 "bystander untouched": bystander.poll() is None}
        ok = all(steps.values())
        happened = ("listed by doctor (exit 1), stopped by the next search before its first trial; bystander "
                    "untouched" if ok else "not: " + ", ".join(k for k, v in steps.items() if not v))
        return Outcome("server left by a dead run", happened, None, finished(folder), len(marked(dead_owner)), ok,
                       {"stderr": err, "doctor": dout, "steps": steps})
    finally:
        for p in (server, bystander):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def start_listening(argv: list[str], env: dict[str, str], attempts: int = 3) -> subprocess.Popen:
    """``argv --port P`` in its own session, once it listens on P. A port taken between
    :func:`free_port` and the bind (other work on a busy machine) is tried again on another."""
    for _ in range(attempts):
        port = free_port()
        proc = subprocess.Popen([*argv, "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: proc.poll() is not None or answers(port), 180)  # noqa: B023 (called here)
        if proc.poll() is None and answers(port):
            return proc
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    raise RuntimeError(f"{argv[:4]} did not start listening in {attempts} attempts")


def answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FOREIGN = """\
import http.server, json, sys
hits = []
class H(http.server.BaseHTTPRequestHandler):
    def _ok(self, body):
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        if self.path == "/hits": return self._ok({"hits": hits})
        self._ok({"object": "list", "data": [{"id": "someone-elses-model"}]} if "models" in self.path else {})
    def do_POST(self):
        hits.append(self.path); self._ok({"choices": [{"text": "x"}]})
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def foreign_server(folder: Path) -> Outcome:
    """Another process answers /health on the port tuner chose: it is reported, never
    replayed against nor killed, and the trial runs on another port."""
    import urllib.request

    from tuner.backends import vllm as vllm_backend
    from tuner.core.errors import EnvironmentFault
    from tuner.serving.config import Deployment, ServeConfig
    from tuner.serving.load import Concurrency
    from tuner.traffic.synth import default_workload

    prepare(folder)
    port = free_port()
    foreign = subprocess.Popen([sys.executable, "-c", FOREIGN, str(port)], start_new_session=True)
    picks = iter([port])
    real = vllm_backend.free_port
    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/health"), 120)
        vllm_backend.free_port = lambda host="127.0.0.1": next(picks, None) or real(host)
        backend = vllm_backend.VllmBackend(vllm_cmd=SIM, log_dir=folder / "logs", stop_grace_s=5)
        dep = Deployment(model="qwen2.5-7b", gpu="H100-SXM")
        faults: list[str] = []
        try:
            inst = backend.start(dep, ServeConfig(max_model_len=4096, max_num_seqs=16))
        except EnvironmentFault as err:  # would only happen if every attempt hit a foreign server
            faults.append(str(err))
            inst = None
        result = None
        if inst is not None:
            with inst:
                moved = all(not u.endswith(f":{port}") for u in inst.urls)
                result = inst.run(default_workload(seed=0, n=12), Concurrency(4))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/hits", timeout=5) as resp:
            hits = json.load(resp)["hits"]
        logs = sorted((folder / "logs").glob("*.log"))
        ok = (inst is not None and moved and result is not None and result.error == [None] * 12
              and hits == [] and foreign.poll() is None and len(logs) == 2)
        return Outcome("foreign server on the port", f"not measured ({len(hits)} requests reached it), left "
                       f"running; trial moved to another port ({len(logs)} starts)", None, None,
                       len(marked(os.getpid())), ok, {"faults": faults, "hits": hits})
    finally:
        vllm_backend.free_port = real
        os.killpg(foreign.pid, signal.SIGKILL)
        foreign.wait()


def _answers(url: str) -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(url, timeout=1)
        return True
    except OSError:
        return False


def port_taken(folder: Path) -> Outcome:
    """The chosen port is taken before the server binds it ([Errno 98]): an environment
    fault, retried on another port; nothing is recorded against the configuration."""
    from tuner.backends import vllm as vllm_backend
    from tuner.serving.config import Deployment, ServeConfig

    prepare(folder)
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused, binds fail
    port = holder.getsockname()[1]
    picks = iter([port])
    real = vllm_backend.free_port
    try:
        vllm_backend.free_port = lambda host="127.0.0.1": next(picks, None) or real(host)
        backend = vllm_backend.VllmBackend(vllm_cmd=SIM, log_dir=folder / "logs", stop_grace_s=5)
        with backend.start(Deployment(model="qwen2.5-7b", gpu="H100-SXM"),
                           ServeConfig(max_model_len=4096, max_num_seqs=16)) as inst:
            moved = all(not u.endswith(f":{port}") for u in inst.urls)
        first_log = next(p for p in (folder / "logs").glob("*.log") if "-a" not in p.stem).read_text()
        ok = moved and "address already in use" in first_log.lower()
        return Outcome("port taken before the bind", "[Errno 98] seen, started again on another port; no trial "
                       "recorded against the configuration", None, None, len(marked(os.getpid())), ok)
    finally:
        vllm_backend.free_port = real
        holder.close()


def bad_command(folder: Path) -> Outcome:
    """A --vllm-cmd that does not exist: exit 2 before any study or trial is written."""
    prepare(folder)
    left: list[int] = []
    code, _, err = _run(folder, *search_args(vllm_cmd="no-such-vllm serve"), left=left)
    ok = code == 2 and one_line(err) and "not an executable" in err and study_db(folder) is None and not sum(left)
    return Outcome("wrong --vllm-cmd", f"exit {code}: '{err.strip()[:70]}'", 0, finished(folder), sum(left), ok,
                   {"stderr": err})


def rejected_flag(folder: Path) -> Outcome:
    """A server that rejects a flag tuner passes: two environment faults in a row stop the
    run (exit 2); neither is counted nor taught; a fixed command measures every configuration."""
    prepare(folder)
    left: list[int] = []
    code, _, err = _run(folder, *search_args(vllm_cmd=SIM + " --no-such-flag"), left=left)
    kinds = [t.user_attrs.get("fail_kind") for t in trials(folder)]
    before = finished(folder)
    rcode, _, _ = _run(folder, *search_args(), left=left)
    counts = measured_configs(folder)
    ok = (code == 2 and one_line(err) and "environment faults in a row" in err and kinds == ["environment"] * 2
          and before == 0 and rcode == 0 and len(counts) == GRID and not sum(left))
    return Outcome("flag the server rejects", f"exit {code} after 2 environment faults, 0 counted; fixed rerun "
                   f"measured {len(counts)}/{GRID}", before, finished(folder), sum(left), ok, {"stderr": err})


def unknown_gpu(folder: Path) -> Outcome:
    """An unknown GPU in the space file: exit 2 naming file:line, nothing written."""
    prepare(folder, SPACE.replace("gpu: H100-SXM", "gpu: RTX-9999"))
    left: list[int] = []
    code, _, err = _run(folder, *search_args(), left=left)
    ok = code == 2 and one_line(err) and "space.yaml:2:" in err and study_db(folder) is None and not sum(left)
    return Outcome("unknown GPU in the space", f"exit {code}: '{err.strip()[:60]}...'", 0, finished(folder),
                   sum(left), ok, {"stderr": err})


def hung_start(folder: Path) -> Outcome:
    """A start that never becomes healthy under --timeout 4: the run stops near the limit
    (not after the 30 min start timeout), the server is stopped, the trial is not counted."""
    prepare(folder)
    t0 = time.monotonic()
    left: list[int] = []
    code, out, err = _run(folder, *search_args("--timeout", "4", vllm_cmd=SIM + " --startup-delay-s 600"),
                          left=left)
    wall = time.monotonic() - t0
    kinds = [(t.state.name, t.user_attrs.get("fail_kind")) for t in trials(folder)]
    ok = wall < 60 and kinds == [("FAIL", "interrupted")] and finished(folder) == 0 and not sum(left) \
        and "--timeout" in err
    return Outcome("hung start, --timeout 4", f"stopped after {wall:.0f} s, exit {code}; trial interrupted, not "
                   "counted", 0, finished(folder), sum(left), ok, {"stderr": err, "wall_s": wall})


def startup_timeout(folder: Path) -> Outcome:
    """--startup-timeout 2 on a server that needs 600 s, for every configuration: no start of
    the study ever succeeded (tuner.search.blame): the first configuration's two timeouts
    cannot be told yet (undecided, not counted), the next two configurations failing alike are
    the machine's: two in a row stop the run with exit 2 and one line naming the flag; nothing
    stored infeasible, nothing counted, the servers stopped."""
    prepare(folder)
    left: list[int] = []
    code, out, err = _run(folder, *search_args("--startup-timeout", "2s", budget=2,
                                               vllm_cmd=SIM + " --startup-delay-s 600"), left=left)
    kinds = [t.user_attrs.get("fail_kind") for t in trials(folder)]
    infeasible = [t for t in trials(folder) if t.user_attrs.get("infeasible_reason")]
    ok = (code == 2 and one_line(err) and "--startup-timeout" in err and "environment faults in a row" in err
          and kinds == ["environment"] * 3 and not infeasible and finished(folder) == 0 and not sum(left))
    return Outcome("--startup-timeout 2s, every config", f"exit {code} after 2 environment faults, 0 counted, "
                   "flag named", 0, finished(folder), sum(left), ok, {"stderr": err, "kinds": kinds})


def window(folder: Path) -> Outcome:
    """--timeout 20 on servers that take 11 s to start: the first trial fits, then the time
    left is shorter than the study's own trial took, so no trial is started only to be
    thrown away; exit 124 saying what is left, and a rerun measures the rest (TPE)."""
    prepare(folder)
    sim = SIM + " --startup-delay-s 11"
    left: list[int] = []
    code, out, err = _run(folder, *[a if a != "grid" else "tpe" for a in search_args("--timeout", "20",
                                                                                     vllm_cmd=sim)], left=left)
    before = finished(folder)
    cut = [t for t in trials(folder) if t.user_attrs.get("fail_kind") == "interrupted"]
    note = json.loads(out).get("notes", []) if out.strip().startswith("{") else []
    # The rerun has no --timeout: how long its servers take to start changes nothing it is
    # asked, so it starts them without the delay (3 trials, 33 s less).
    rcode, _, _ = _run(folder, *[a if a != "grid" else "tpe" for a in search_args()], left=left)
    ok = (code == 124 and one_line(err) and "run the same command again" in err and before >= 1 and not cut
          and any("trials are left for the next run" in n for n in note) and rcode == 0
          and finished(folder) == GRID and not sum(left))
    return Outcome("--timeout 20, 11 s starts (TPE)", f"exit {code} after {before} trial(s), {len(cut)} cut; "
                   f"rerun exit {rcode}", before, finished(folder), sum(left), ok,
                   {"stderr": err, "notes": note, "code": code, "cut": len(cut)})


def confirm_window(folder: Path) -> Outcome:
    """--timeout 22 with --confirm 1 on servers that take 11 s to start (TPE): the budget's
    trial fits, its confirmation repeat would not (the study's own trial took longer than
    what is left), so none is started: exit 124 saying the confirmation is left, no trial
    cut; the rerun confirms and exits 0."""
    prepare(folder)
    sim = SIM + " --startup-delay-s 11"
    args = [a if a != "grid" else "tpe" for a in search_args("--timeout", "22", vllm_cmd=sim, budget=1,
                                                             confirm=True)]
    args += ["--confirm", "1", "--confirm-max", "1"]
    left: list[int] = []
    code, out, err = _run(folder, *args, left=left)
    before = finished(folder)
    cut = [t for t in trials(folder) if t.user_attrs.get("fail_kind") == "interrupted"]
    note = json.loads(out).get("notes", []) if out.strip().startswith("{") else []
    # The rerun has no --timeout: its servers start without the delay (see window).
    rerun = [a if a != sim else SIM for a in args if a not in ("--timeout", "22")]
    rcode, rout, _ = _run(folder, *rerun, left=left)
    repeats = confirmation_repeats(folder)
    ok = (code == 124 and one_line(err) and "not confirmed yet" in err and before == 1 and not cut
          and any("confirmation's repeats" in n for n in note) and rcode == 0 and len(repeats) >= 1
          and not sum(left))
    return Outcome("--timeout 22, confirmation would not fit", f"exit {code}, {len(cut)} cut, confirmation left; "
                   f"rerun exit {rcode}, {len(repeats)} repeat(s)", before, finished(folder), sum(left), ok,
                   {"code": code, "stderr": err, "notes": note, "cut": len(cut), "rerun": rcode})


@contextlib.contextmanager
def small_disk(path: Path, size: str):
    """A tmpfs of ``size`` at ``path``; None when this machine does not let us mount one."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        yield None
        return
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def disk_full(folder: Path) -> Outcome | None:
    """The studies folder fills up mid-study (a 1.5 MB tmpfs): one line naming the path,
    the study's file passes integrity_check, no 0-byte or partial file; `tuner report` on
    the full disk is one line too. None when no tmpfs can be mounted here."""
    import sqlite3

    prepare(folder)
    with small_disk(folder / "studies", "1500k") as mnt:
        if mnt is None:
            return None
        left: list[int] = []
        code, _, err = _run(folder, "search", "--budget", "40", left=left)
        db = study_db(folder)
        integrity = sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] if db else "no file"
        before = finished(folder)
        for f in mnt.rglob("*.png"):
            f.unlink()
        with open(mnt / "fill", "wb") as fh:  # fill what is left
            with contextlib.suppress(OSError):
                fh.write(b"\0" * 4_000_000)
        rcode, _, rerr = _run(folder, "report", left=left)
        # a report, plan or figure must never be left empty (SQLite's own -wal/-shm and lock files may be)
        empty = [str(p) for p in mnt.rglob("*") if p.is_file() and p.stat().st_size == 0
                 and p.suffix in (".png", ".html", ".md", ".json")]
        partial = [str(p) for p in mnt.rglob(".*.tmp-*")]
        ok = (code == 2 and one_line(err) and "free space" in err and integrity == "ok" and before >= 1
              and rcode == 2 and one_line(rerr) and not empty and not partial and not sum(left))
        return Outcome("disk full mid-study", f"exit {code}: '{err.strip()[:50]}...'; integrity {integrity}; "
                       f"report exit {rcode}, no empty files", before, before, sum(left), ok,
                       {"stderr": err, "report_stderr": rerr, "empty": empty})


# -- study identity and state ------------------------------------------------------------------
def sim_args(*extra: str, budget: int = 2, sampler: str = "tpe") -> list[str]:
    """A simulator study of space.yaml (no server: what is tested is the study's state)."""
    return ["search", "--space", "space.yaml", "--sampler", sampler, "--budget", str(budget), "--output", "json",
            "--confirm", "0", *extra]


def space_changed(folder: Path) -> Outcome:
    """The space is edited but keeps its name: the rerun is refused in one line saying what
    differs (nothing written), a file that parses the same (comments, key order) resumes;
    --resume-anyway goes on over an edit the study can hold (a fixed value), and over other
    choices of a searched knob (which Optuna keeps one distribution of per study) it is
    refused in one line too, nothing written (TPE)."""
    prepare(folder)
    left: list[int] = []
    code, out, _ = _run(folder, *sim_args(), left=left)
    before = finished(folder)
    same = "# reordered, commented: the same space\n" + SPACE.replace(
        "  max_num_seqs: {choices: [16, 64]}\n  max_model_len: 4096\n",
        "  max_model_len: 4096   # fixed\n  max_num_seqs: {choices: [16, 64]}\n")
    (folder / "space.yaml").write_text(same)
    scode, _, serr = _run(folder, *sim_args(budget=3), left=left)
    (folder / "space.yaml").write_text(SPACE.replace("[16, 64]", "[16, 32, 64]"))
    rcode, _, rerr = _run(folder, *sim_args(budget=4), left=left)
    refused_at = finished(folder)
    ccode, _, cerr = _run(folder, *sim_args("--resume-anyway", budget=4), left=left)
    kept = finished(folder)
    (folder / "space.yaml").write_text(SPACE.replace("  max_model_len: 4096\n", "  max_model_len: 8192\n"))
    acode, _, aerr = _run(folder, *sim_args("--resume-anyway", budget=4), left=left)
    ok = (code == 0 and before == 2 and scode == 0 and rcode == 2 and one_line(rerr)
          and "another space" in rerr and "max_num_seqs choices [16, 64] -> [16, 32, 64]" in rerr
          and "--resume-anyway" in rerr and refused_at == 3 and ccode == 2 and "max_num_seqs" in cerr
          and kept == 3 and acode == 0 and finished(folder) == 4 and not sum(left))
    return Outcome("space edited, same name (TPE)", f"same content resumed (exit {scode}); edited: exit {rcode}, "
                   f"'{rerr.strip()[7:75]}...'; --resume-anyway exit {acode}", before, finished(folder), sum(left),
                   ok, {"codes": (code, scode, rcode, acode), "stderr": rerr, "same": serr, "anyway": aerr,
                        "choices": (ccode, cerr)})


def study_names(folder: Path) -> Outcome:
    """--study names that would leave studies/ (../../escape, a/b), one too long, one with a
    space: one line each, exit 2, nothing written anywhere; studies show in a folder
    without studies/ says so."""
    work = prepare(folder / "a" / "b")
    left: list[int] = []
    results = {}
    for name in ("../../escape", "x/y", "n" * 250, "a b"):
        code, _, err = _run(work, *sim_args("--study", name, budget=1), left=left)
        results[name[:20]] = (code, err)
    written = [str(p) for p in folder.rglob("*") if p.is_file() and p.name != "space.yaml"]
    scode, _, serr = _run(work, "studies", "show", "nothere", left=left)
    ok = (all(c == 2 and one_line(e) and "study name" in e and "cannot write" not in e for c, e in results.values())
          and not written and scode == 2 and one_line(serr) and "there is no studies/ folder" in serr and not sum(left))
    return Outcome("bad --study names", f"exit {sorted({c for c, _ in results.values()})} for {len(results)} names, "
                   f"{len(written)} files written; no studies/: '{serr.strip()[7:40]}...'", 0, 0, sum(left), ok,
                   {"results": results, "written": written, "show": (scode, serr)})


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` read-only: a read-only bind mount where this process may mount (root, whom
    permission bits do not stop), else its and its files' write permission taken away."""
    done = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True)
    if done.returncode == 0:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True, capture_output=True)
        try:
            yield "read-only mount"
        finally:
            subprocess.run(["umount", str(folder)], capture_output=True)
        return
    modes = {p: p.stat().st_mode for p in [folder, *folder.iterdir()]}
    for p, mode in modes.items():
        p.chmod(mode & ~0o222)
    try:
        yield "no write permission"
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


def read_only_study(folder: Path) -> Outcome:
    """A study whose file and folder cannot be written: tuner studies show, tuner plan (the
    plan shown, not stored, its files skipped with a warning) and tuner report --out work;
    a report into the study's folder and a search are refused in one line each; the file
    is unchanged."""
    import hashlib

    prepare(folder)
    left: list[int] = []
    code, out, _ = _run(folder, *sim_args("--study", "ro", budget=3), left=left)
    db = folder / "studies" / "ro.db"
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    with read_only(folder / "studies") as how:
        shown = _run(folder, "studies", "show", "ro", left=left)
        plan = _run(folder, "plan", "--study", "ro", "--output", "json", left=left)
        report = _run(folder, "report", "ro", "--out", str(folder / "elsewhere"), left=left)
        inside = _run(folder, "report", "ro", left=left)
        search = _run(folder, *sim_args("--study", "ro", budget=4), left=left)
    same = hashlib.sha256(db.read_bytes()).hexdigest() == digest
    plan_notes = json.loads(plan[1]).get("notes", []) if plan[1].strip().startswith("{") else []
    ok = (code == 0 and shown[0] == 0 and "vllm serve" in shown[1] and plan[0] == 0
          and any("read-only" in n for n in plan_notes) and report[0] == 0
          and (folder / "elsewhere" / "report.html").is_file() and inside[0] == 2 and one_line(inside[2])
          and "--out" in inside[2] and search[0] == 2 and one_line(search[2]) and "read-only" in search[2]
          and all(one_line(r[2]) for r in (shown, plan, report)) and same and finished(folder) == 3
          and not sum(left))
    return Outcome(f"read-only study ({how})", f"show/plan/report --out exit {shown[0]}/{plan[0]}/{report[0]}; "
                   f"report into it exit {inside[0]}, search exit {search[0]}, one line each; file unchanged: {same}",
                   3, finished(folder), sum(left), ok,
                   {"shown": shown, "plan": plan[0::2], "report": report, "inside": inside, "search": search,
                    "notes": plan_notes, "same": same, "how": how})


#: ``tuner ARGS`` that imports everything first, says so with the file ``ready-PID``, then
#: waits for the file ``go``: processes started with it open their storage within a
#: millisecond of each other.
AT_ONCE = ("import os, sys, time\nimport optuna, sqlalchemy\nimport tuner.cli, tuner.search, tuner.study.storage\n"
           "open(f'ready-{os.getpid()}', 'w').close()\n"
           "while not os.path.exists('go'):\n    time.sleep(0.0005)\n"
           "sys.argv = ['tuner', *sys.argv[1:]]\ntuner.cli.main()\n")


def shared_sqlite_creation(folder: Path, pairs: int = 4) -> Outcome:
    """Two studies created in one new SQLite file by two processes at the same instant,
    ``pairs`` times (TPE and grid): never "table studies already exists" nor "UNIQUE
    constraint failed: alembic_version"; each run either runs or is refused in the one
    line for a SQLite file another process writes."""
    prepare(folder)
    bad: list[str] = []
    left: list[int] = []
    for i in range(pairs):
        (folder / "go").unlink(missing_ok=True)
        for f in folder.glob("shared.db*"):
            f.unlink()
        procs = [subprocess.Popen([sys.executable, "-c", AT_ONCE, *sim_args("--storage", "sqlite:///shared.db",
                                   "--study", f"{name}{i}", budget=1, sampler=sampler)], cwd=folder, env=env(),
                                  text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
                 for name, sampler in (("a", "tpe"), ("b", "grid"))]
        wait_for(lambda: all((folder / f"ready-{p.pid}").exists() or p.poll() is not None for p in procs),  # noqa: B023
                 timeout=60, step=0.01)  # both imported and waiting
        (folder / "go").write_text("")
        for proc in procs:
            code, _, err = finish(proc)
            left.append(wait_gone(proc.pid, timeout=10))
            if not one_line(err) or (code != 0 and "SQLite takes one writer" not in err):
                bad.append(f"exit {code}: {err.strip()[:200]}")
    ok = not bad and not sum(left)
    return Outcome("2 processes create one SQLite file", f"{pairs} pairs started within 1 ms: {len(bad)} failed "
                   "creating it", 0, 0, sum(left), ok, {"bad": bad})


# -- bad answers and credentials ------------------------------------------------------------
BAD_SERVER = REPO / "tests" / "replay" / "bad_server.py"
SECRET = "sk-faults-secret-7f3a9c01"


@contextlib.contextmanager
def bad_server(*args: str):
    """tests/replay/bad_server.py (``--mode``, ``--key``) on a free port; yields its base URL.
    It is no tuner-marked server: the scenarios count only the processes tuner leaves."""
    from tuner.backends.local_server import start_local_server

    port = free_port()
    proc, url = start_local_server([sys.executable, str(BAD_SERVER), "--port", str(port), *args], port,
                                   what="bad server", env=env())
    try:
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _run(folder: Path, *args: str, left: list[int], **kw: Any) -> tuple[int, str, str]:
    """:func:`tuner` to its end; appends the tuner-marked processes it left (its own only:
    other runs on this host may hold theirs) to ``left``."""
    proc = tuner(folder, *args, **kw)
    code, out, err = finish(proc)
    left.append(wait_gone(proc.pid, timeout=10))
    return code, out, err


def endpoint_args(url: str, *extra: str, budget: int = 2) -> list[str]:
    return ["search", "--space", "space.yaml", "--backend", "endpoint", "--endpoint", url, "--sampler", "grid",
            "--budget", str(budget), "--output", "json", *extra]


def _bad_answers(folder: Path, mode: str, kind: str, *extra: str) -> Outcome:
    """Every answer of the endpoint is bad in one way (``mode``): no trial is feasible,
    each stores the failed requests under ``kind`` and no tokens; the run exits 3 with one
    line naming the kind (never 'P95 TTFT nan'); tuner studies show counts them."""
    from tuner.serving.result import describe_errors

    prepare(folder)
    left: list[int] = []
    t0 = time.monotonic()
    with bad_server("--mode", mode) as url:
        code, out, err = _run(folder, *endpoint_args(url, *extra), left=left)
    wall = time.monotonic() - t0
    done = [t for t in trials(folder) if t.state.name == "COMPLETE"]
    scode, sout, _ = _run(folder, "studies", "show", json.loads(out)["study"], "--output", "json", left=left) \
        if out.strip() else (None, "{}", "")
    shown = json.loads(sout or "{}")
    notes = json.loads(out).get("notes", []) if out.strip().startswith("{") else []
    once = sum("cannot change the server's configuration" in n for n in notes) == 1
    ok = (code == 3 and one_line(err) and f"{kind} x" in err and "nan" not in err and len(done) == 1 and once
          and all(not t.user_attrs.get("feasible") and t.user_attrs.get("failed_by") == "errors"
                  and set(t.user_attrs.get("errors", {})) == {kind} and t.user_attrs.get("tokens_per_s") == 0
                  for t in done)
          and scode == 0 and kind in (shown.get("errors_total") or {}) and kind in str(shown.get("closest_miss")))
    why = err.strip().split("; trial ", 1)[-1]
    return Outcome(f"endpoint: {mode.replace('_', ' ')}", f"exit {code} in {wall:.0f} s, measured once, not feasible, "
                   f"{describe_errors(shown.get('errors_total'))} in all; 'trial {why[:60]}...'", 0,
                   finished(folder), sum(left), ok,
                   {"code": code, "stderr": err, "shown": shown, "wall_s": wall,
                    "errors": [t.user_attrs.get("errors") for t in done]})


def garbage_stream(folder: Path) -> Outcome:
    """A stream whose token chunks are broken JSON holding "choices": stream_error, no tokens
    counted (it once scored 163,533 tok/s, feasible, exit 0)."""
    return _bad_answers(folder, "garbage", "stream_error")


def all_429(folder: Path) -> Outcome:
    return _bad_answers(folder, "http_429", "http_429")


def all_500(folder: Path) -> Outcome:
    return _bad_answers(folder, "http_500", "http_500")


def hang_mid_stream(folder: Path) -> Outcome:
    """A server that sends one chunk then nothing: --request-timeout 1s makes every request a
    timeout; each replay stops after one burst of them (not after the whole workload)."""
    o = _bad_answers(folder, "hang", "timeout", "--request-timeout", "1s")
    o.ok = o.ok and o.details["wall_s"] < 90
    return o


TCP_STUB = REPO / "tests" / "faults" / "tcp_stub.py"


def _no_env_stored(folder: Path) -> bool:
    """No trial of the study stored infeasible, none counted: an endpoint fault teaches nothing."""
    return finished(folder) == 0 and not [t for t in trials(folder) if t.user_attrs.get("infeasible_reason")]


def endpoint_down(folder: Path, behaviour: str) -> Outcome:
    """An endpoint that refuses connections (nothing listens), resets them, or accepts and
    never answers (a real process on loopback, tests/faults/tcp_stub.py): exit 5 before any
    study is written, one line naming the URL and the cause (never 'cannot write the study',
    never exit 1)."""
    prepare(folder)
    left: list[int] = []
    stub = None
    if behaviour == "refused":
        url = f"http://127.0.0.1:{free_port()}"
    else:
        stub = subprocess.Popen([sys.executable, str(TCP_STUB), behaviour], stdout=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{int(stub.stdout.readline())}"
    try:
        code, _, err = _run(folder, *endpoint_args(url), left=left)
    finally:
        if stub is not None:
            stub.kill()
            stub.wait()
    words = {"refused": "connection refused", "reset": "connection reset", "hold": "no answer in time"}[behaviour]
    ok = (code == 5 and one_line(err) and url in err and words in err and "cannot write the study" not in err
          and study_db(folder) is None and not sum(left))
    return Outcome(f"endpoint: {words}", f"exit {code}, '{err.strip()[7:70]}...', nothing written", 0, 0,
                   sum(left), ok, {"code": code, "stderr": err})


def instant_stream(folder: Path) -> Outcome:
    """An endpoint whose every stream is one instant chunk claiming all the forced tokens
    (once stored feasible at 253,692 tok/s): a bad stream, the server's fault: exit 5, one
    line naming the URL; the trial fails as the environment's (not counted, not infeasible)."""
    prepare(folder)
    left: list[int] = []
    with bad_server("--mode", "instant") as url:
        code, out, err = _run(folder, *endpoint_args(url), left=left)
    kinds = [t.user_attrs.get("fail_kind") for t in trials(folder)]
    feasible = [t for t in trials(folder) if t.user_attrs.get("feasible")]
    ok = (code == 5 and one_line(err) and url in err and "did not arrive as its usage claims" in err
          and kinds == ["environment"] and not feasible and _no_env_stored(folder) and not sum(left))
    return Outcome("endpoint: one instant chunk per stream", f"exit {code}, bad stream named, 0 feasible, "
                   "0 counted", 0, finished(folder), sum(left), ok, {"code": code, "stderr": err, "kinds": kinds})


def _running(folder: Path) -> bool:
    """A trial of the study RUNNING, read with sqlite3 read-only (opening with Optuna while
    tuner creates the file would race its creation)."""
    import sqlite3

    db = study_db(folder)
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            return bool(db and conn.execute("SELECT count(*) FROM trials WHERE state = 'RUNNING'").fetchone()[0])
    except sqlite3.Error:
        return False


def endpoint_dies(folder: Path) -> Outcome:
    """The endpoint is killed mid-replay (its requests disconnect, then nothing listens): the
    trial fails as the environment's (not counted, not infeasible) and the run stops at once,
    exit 5, naming the URL; once it is back the same command measures it."""
    from tuner.backends.local_server import start_local_server

    prepare(folder)
    left: list[int] = []
    port = free_port()
    argv = [sys.executable, str(BAD_SERVER), "--port", str(port), "--step-s", "0.05"]
    server, url = start_local_server(argv, port, what="bad server", env=env())
    proc = tuner(folder, *endpoint_args(url))
    running = wait_for(lambda: _running(folder), timeout=60)
    time.sleep(1.0)
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()
    code, _, err = finish(proc)
    left.append(wait_gone(proc.pid, timeout=10))
    kinds = [t.user_attrs.get("fail_kind") for t in trials(folder)]
    clean = _no_env_stored(folder)
    server, url = start_local_server(argv[:-2] + ["--step-s", "0.001"], port, what="bad server", env=env())
    try:
        rcode, _, rerr = _run(folder, *endpoint_args(url), left=left)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    ok = (running and code == 5 and one_line(err) and url in err and kinds == ["environment"] and clean
          and rcode == 0 and finished(folder) == 1 and not sum(left))
    return Outcome("endpoint killed mid-replay", f"exit {code}, 1 environment fault, 0 counted; back up: rerun "
                   f"exit {rcode}", 0, finished(folder), sum(left), ok,
                   {"code": code, "stderr": err, "kinds": kinds, "rerun": (rcode, rerr)})


def _leaks(folder: Path, *texts: str) -> list[str]:
    """Where SECRET shows: the study's files (database, -wal), reports, and the texts given."""
    found = [str(p) for p in folder.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    return found + [f"output {i}" for i, t in enumerate(texts) if SECRET in t]


def key_in_url(folder: Path) -> Outcome:
    """An endpoint whose URL carries the key (http://user:KEY@host): the key is sent, and
    is in no study file, no output, no report; a wrong key in the URL is one line, exit 2,
    with the URL masked and nothing written."""
    prepare(folder)
    left: list[int] = []
    with bad_server("--key", SECRET) as url:
        host = url.removeprefix("http://")
        wcode, wout, werr = _run(folder, *endpoint_args(f"http://me:sk-wrong-00000000@{host}"), left=left)
        nothing = study_db(folder) is None
        code, out, err = _run(folder, *endpoint_args(f"http://me:{SECRET}@{host}/v1"), left=left)
    study = json.loads(out)["study"] if out.strip() else ""
    scode, sout, serr = _run(folder, "studies", "show", study, left=left)
    jcode, jout, jerr = _run(folder, "studies", "show", study, "--output", "json", left=left)
    rcode, rout, rerr = _run(folder, "report", left=left)
    leaks = _leaks(folder, werr, wout, out, err, sout, serr, jout, jerr, rout, rerr)
    ok = (wcode == 2 and one_line(werr) and "answered 401" in werr and "sk-wrong" not in werr and nothing
          and code == 0 and scode == 0 and jcode == 0 and rcode == 0
          and (folder / "studies" / study / "report.html").is_file() and not leaks)
    return Outcome("endpoint: key in the URL", f"wrong key: exit {wcode}, one line; right key: exit {code}; "
                   f"key found in {len(leaks)} files/outputs (db, stderr, report.html, studies show)", 0,
                   finished(folder), sum(left), ok,
                   {"wrong": (wcode, werr), "code": code, "stderr": err, "leaks": leaks})


def api_key(folder: Path) -> Outcome:
    """An endpoint that wants a key: without one, exit 2 before any study is written, one
    line saying how to give it; with --api-key-file, or OPENAI_API_KEY, the study runs and
    the key is in no file and no output."""
    import urllib.request

    prepare(folder)
    (folder / "key.txt").write_text(SECRET + "\n")
    left: list[int] = []
    with bad_server("--key", SECRET) as url:
        ncode, _, nerr = _run(folder, *endpoint_args(url), left=left)
        nothing = study_db(folder) is None
        fcode, fout, ferr = _run(folder, *endpoint_args(url, "--api-key-file", "key.txt", budget=1), left=left)
        ecode, eout, eerr = _run(folder, *endpoint_args(url, budget=2), env={**env(), "OPENAI_API_KEY": SECRET},
                                 left=left)
        with urllib.request.urlopen(f"{url}/debug/auth", timeout=10) as resp:
            seen = json.load(resp)
    (folder / "key.txt").unlink()
    study = json.loads(fout)["study"] if fout.strip() else ""
    rcode, rout, rerr = _run(folder, "report", left=left)
    scode, sout, serr = _run(folder, "studies", "show", study, "--output", "json", left=left)
    leaks = _leaks(folder, nerr, fout, ferr, eout, eerr, rout, rerr, sout, serr)
    ok = (ncode == 2 and one_line(nerr) and "--api-key-file" in nerr and nothing and fcode == 0 and ecode == 0
          and rcode == 0 and scode == 0 and seen["ok"] > 0 and not leaks)
    return Outcome("endpoint wants an API key", f"no key: exit {ncode}, one line; --api-key-file: exit {fcode}; "
                   f"OPENAI_API_KEY: exit {ecode}; key found in {len(leaks)} files/outputs", 0, finished(folder),
                   sum(left), ok, {"no_key": (ncode, nerr), "file": (fcode, ferr), "env": (ecode, eerr),
                                       "leaks": leaks, "seen": seen})


ALL = [
    ("sigterm", lambda f: stop_signal(f, signal.SIGTERM)),
    ("sigint", lambda f: stop_signal(f, signal.SIGINT)),
    ("sighup", lambda f: stop_signal(f, signal.SIGHUP)),
    ("sigkill", sigkill),
    ("wrapper_sigkill", wrapper_sigkill),
    ("killed_once", lambda f: killed_from_outside(f, 1)),
    ("killed_once_tpe", lambda f: killed_from_outside(f, 1, "tpe")),
    ("killed_twice", lambda f: killed_from_outside(f, 2)),
    ("positional_model", positional_model),
    ("stale_server", stale_server),
    ("foreign_server", foreign_server),
    ("port_taken", port_taken),
    ("bad_command", bad_command),
    ("rejected_flag", rejected_flag),
    ("unknown_gpu", unknown_gpu),
    ("hung_start", hung_start),
    ("startup_timeout", startup_timeout),
    ("window", window),
    ("confirm_window", confirm_window),
    ("disk_full", disk_full),
    ("garbage_stream", garbage_stream),
    ("all_429", all_429),
    ("all_500", all_500),
    ("hang_mid_stream", hang_mid_stream),
    ("space_changed", space_changed),
    ("study_names", study_names),
    ("shared_sqlite", shared_sqlite_creation),
    ("read_only_study", read_only_study),
    ("endpoint_refused", lambda f: endpoint_down(f, "refused")),
    ("endpoint_reset", lambda f: endpoint_down(f, "reset")),
    ("endpoint_hung", lambda f: endpoint_down(f, "hold")),
    ("endpoint_dies", endpoint_dies),
    ("instant_stream", instant_stream),
    ("key_in_url", key_in_url),
    ("api_key", api_key),
]

# -- issue 48: staged as sites stage them (tests/faults/staged.py, staged_ops.py) -------------
import staged  # noqa: E402
import staged_ops  # noqa: E402

# every entry looks its scenario up when it runs: staged.py imports this module, and may be imported first

ALL += [
    ("launcher_timeout", lambda f: staged.launcher(f, "timeout")),
    ("launcher_daemon", lambda f: staged.launcher(f, "daemon")),
    ("paused", lambda f: staged.paused(f)),
    ("terminated", lambda f: staged.terminated(f)),
    ("warming_up", lambda f: staged.warming_up(f)),
    ("knob_failure", lambda f: staged.knob_failure(f)),
    ("hexid_failure", lambda f: staged.hexid_failure(f)),
    ("transient", lambda f: staged.transient(f)),
    ("study_deleted", lambda f: staged.study_deleted(f)),
    ("broken_nightly_study", lambda f: staged.broken_nightly_study(f)),
    ("efbig", lambda f: staged.efbig(f)),
    ("quiet_night", lambda f: staged_ops.quiet_night(f)),
    ("password_everywhere", lambda f: staged_ops.password_everywhere(f)),
    ("bad_seed", lambda f: staged_ops.bad_seed(f)),
    ("huge_trace", lambda f: staged_ops.huge_trace(f)),
    ("impossible_request", lambda f: staged_ops.impossible_request(f)),
    ("endpoint_command", lambda f: staged_ops.endpoint_command(f)),
]
