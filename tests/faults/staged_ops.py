"""Faults of unattended runs and their inputs (issue 48, with tests/faults/staged.py): a
quiet night, a password in every command's storage URL (a real PostgreSQL server that
asks for it), ``--seed -1``, a 10^6-row trace under ``--timeout 30``, a request no
max-model-len holds, an endpoint study's ``vllm serve`` command."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import scenarios as sc

Outcome = sc.Outcome
PASSWORD = "pw-faults-Secret-4d1e"


def trace(path: Path, n: int, seed: int = 0, huge_row: int | None = None, mix: bool = True) -> Path:
    """``n`` requests as tuner's JSONL (one header line, then a row per request in arrival
    order, 4 a second): the built-in mix, or (``mix`` False) every one 400 prompt and 150
    output tokens (one shape at any count); row ``huge_row`` (0-based) asks for 99,999,999
    prompt tokens."""
    import numpy as np

    from tuner.traffic import native
    from tuner.traffic.synth import article_mix
    from tuner.traffic.workload import Workload

    w = article_mix(n, rate=4.0, seed=seed) if mix else Workload(
        arrival_s=np.arange(n) / 4.0, prompt_tokens=np.full(n, 400), output_tokens=np.full(n, 150), source=str(path))
    if huge_row is not None:
        prompts = w.prompt_tokens.copy()
        prompts[huge_row] = 99_999_999
        w = type(w)(arrival_s=w.arrival_s, prompt_tokens=prompts, output_tokens=w.output_tokens, source=str(path))
    return native.write(w, path)


def quiet_night(folder: Path) -> Outcome:
    """Night 1 replays 200 requests, night 2 a quiet 12 of the same shape: not a
    regression (it once exited 4, 'REGRESSION -84.9 %') but 'workload changed', exit 0."""
    sc.prepare(folder)
    trace(folder / "busy.jsonl", 200, mix=False)
    trace(folder / "quiet.jsonl", 12, mix=False)
    args = ["nightly", "--space", "space.yaml", "--trials", "2", "--study", "n"]
    code1, out1, err1 = sc.finish(sc.tuner(folder, *args, "--trace", "busy.jsonl"))
    code2, out2, err2 = sc.finish(sc.tuner(folder, *args, "--trace", "quiet.jsonl"))
    ok = code1 == 0 and code2 == 0 and "REGRESSION" not in out2 and "workload changed" in out2 \
        and "200 -> 12 requests" in out2 and sc.one_line(err2)
    line = next((ln for ln in out2.splitlines() if "regression" in ln.lower() or "workload" in ln), out2.strip()[:80])
    return Outcome("quiet night (12 requests after 200)", f"exit {code1}, then {code2}: '{line[:90]}'", None, None, 0,
                   ok, {"codes": (code1, code2), "out": out2, "stderr": (err1, err2)})


def bad_seed(folder: Path) -> Outcome:
    """``--seed -1`` (search and nightly): exit 2, one line naming --seed, nothing written
    (it once printed a numpy traceback, exit 1)."""
    sc.prepare(folder)
    codes = {}
    for cmd in (sc.sim_args("--seed", "-1"), ["nightly", "--space", "space.yaml", "--trials", "1", "--seed", "-1"]):
        code, _, err = sc.finish(sc.tuner(folder, *cmd))
        codes[cmd[0]] = (code, err)
    ok = all(c == 2 and sc.one_line(e) and "--seed" in e for c, e in codes.values()) and sc.study_db(folder) is None
    return Outcome("--seed -1", "; ".join(f"{k}: exit {c}, '{e.strip()[7:60]}'" for k, (c, e) in codes.items()), 0, 0,
                   0, ok, {"codes": codes})


def huge_trace(folder: Path) -> Outcome:
    """A 10^6-row trace with ``--timeout 30``: each load would replay the whole trace (minutes
    a load), so no trial could finish in the window; tuner says so in one line and replays a
    sample that fits (it once exited 124 with 0 trials on every rerun, for ever)."""
    sc.prepare(folder)
    trace(folder / "big.jsonl", 1_000_000)
    code, out, err = sc.finish(sc.tuner(folder, *sc.sim_args("--trace", "big.jsonl", "--timeout", "30", budget=2)),
                               timeout=400)
    report = json.loads(out) if out.strip().startswith("{") else {}
    notes = " ".join(report.get("notes") or [])
    done = sc.finished(folder)
    ok = code in (0, 124) and done >= 1 and sc.one_line(err) and "1,000,000" in notes
    return Outcome("10^6-row trace, --timeout 30", f"exit {code}, {done} trials; '{notes[:90]}'", 0, done, 0, ok,
                   {"code": code, "stderr": err, "notes": notes})


def impossible_request(folder: Path) -> Outcome:
    """A trace row of 99,999,999 prompt tokens (no max-model-len holds it): named at load,
    exit 2, nothing started (it once failed every trial http_400, exit 3)."""
    sc.prepare(folder)
    trace(folder / "t.jsonl", 40, huge_row=17)
    left: list[int] = []
    code, _, err = sc._run(folder, *sc.search_args("--trace", "t.jsonl"), left=left)
    ok = code == 2 and sc.one_line(err) and "t.jsonl:" in err and "99,999,999" in err and sc.study_db(folder) is None \
        and not sum(left)
    return Outcome("a 99,999,999-token prompt in the trace", f"exit {code}: '{err.strip()[7:90]}...'", 0,
                   sc.finished(folder), sum(left), ok, {"code": code, "stderr": err})


def endpoint_command(folder: Path) -> Outcome:
    """An endpoint study (the server someone else runs; the space's knobs are not applied)
    prints no ``vllm serve`` command, in text or JSON, and says the knobs were not applied."""
    from tuner.backends.local_server import start_local_server

    sc.prepare(folder)
    port = sc.free_port()
    server, url = start_local_server([sys.executable, "-m", "tuner", "sim-serve", "qwen2.5-7b", "--speed", "50",
                                      "--max-model-len", "4096", "--port", str(port)], port, env=sc.env(),
                                     what="sim-serve", timeout_s=120)
    left: list[int] = []
    try:
        tcode, tout, terr = sc._run(folder, *[a for a in sc.endpoint_args(url, budget=1) if a not in ("--output", "json")],  # noqa: E501
                                    left=left)
        jcode, jout, _ = sc._run(folder, *sc.endpoint_args(url, budget=1), left=left)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, 9)
        server.wait()
    best = (json.loads(jout).get("best") or {}) if jout.strip().startswith("{") else {}
    ok = tcode == 0 and jcode == 0 and "vllm serve" not in tout and not best.get("command") and "not applied" in tout
    return Outcome("endpoint study: serve command", f"exit {tcode}/{jcode}; 'vllm serve' printed: "
                   f"{'vllm serve' in tout}, in JSON: {bool(best.get('command'))}", 0, 1, sum(left), ok,
                   {"out": tout, "json": best})


# -- a password in every command's storage URL ---------------------------------------------
PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin"))


@contextlib.contextmanager
def private_postgres():
    """A PostgreSQL server of its own (password authentication, a free port, data in a
    temporary folder), as ``postgresql://tuner:PASSWORD@127.0.0.1:PORT/postgres``; None
    where this machine cannot run one (no server binaries, not root)."""
    if not PG_BIN or os.geteuid() != 0 or shutil.which("su") is None:
        yield None
        return
    bin_ = PG_BIN[-1]
    root = Path(tempfile.mkdtemp(prefix="tuner-faults-pg-"))
    root.chmod(0o755)
    data, pw = root / "data", root / "pw"
    pw.write_text(PASSWORD + "\n")
    subprocess.run(["chown", "-R", "postgres", str(root)], check=True)
    port = sc.free_port()

    def as_pg(cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(["su", "postgres", "-s", "/bin/bash", "-c", cmd], capture_output=True, text=True)

    try:
        made = as_pg(f"{bin_}/initdb -D {data} -U tuner --auth=scram-sha-256 --pwfile={pw} >/dev/null")
        started = made.returncode == 0 and as_pg(
            f"{bin_}/pg_ctl -D {data} -l {root}/log -o '-p {port} -k {root} -c listen_addresses=127.0.0.1' "
            "-w start >/dev/null").returncode == 0
        yield f"postgresql://tuner:{PASSWORD}@127.0.0.1:{port}/postgres" if started else None
    finally:
        as_pg(f"{bin_}/pg_ctl -D {data} -m immediate -w stop >/dev/null 2>&1")
        shutil.rmtree(root, ignore_errors=True)


def password_everywhere(folder: Path) -> Outcome | None:
    """Every command given ``--storage postgresql://tuner:PASSWORD@...`` (search, nightly,
    studies, studies show, plan, report, export, doctor; and a wrong password): the
    password is in none of their stdout, stderr or the files they write. None where no
    PostgreSQL server can be started here."""
    with private_postgres() as url:
        if url is None:
            return None
        sc.prepare(folder)
        wrong = url.replace(PASSWORD, "wrong-" + PASSWORD[::-1])
        study = "pw"
        commands = [
            sc.sim_args("--storage", url, "--study", study),
            ["nightly", "--space", "space.yaml", "--trials", "1", "--storage", url, "--study", "pwnight"],
            ["studies", "--storage", url],
            ["studies", "show", study, "--storage", url],
            ["studies", "show", study, "--storage", url, "--output", "json"],
            ["plan", "--target-ttft", "2s", "--study", study, "--storage", url, "--output", "json"],
            ["report", study, "--storage", url, "--out", "report"],
            ["export", study, "--storage", url, "--out", "trials.csv"],
            ["doctor", "--storage", url],
            sc.sim_args("--storage", wrong, "--study", study),
            ["studies", "--storage", wrong],
        ]
        runs = []
        for cmd in commands:
            code, out, err = sc.finish(sc.tuner(folder, *cmd))
            runs.append((" ".join(cmd[:2]), code, out, err))
    secrets = (PASSWORD, PASSWORD[::-1])
    leaks = [f"{name}: {'stdout' if any(s in out for s in secrets) else 'stderr'}"
             for name, _, out, err in runs if any(s in out + err for s in secrets)]
    leaks += [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
              and any(s.encode() in p.read_bytes() for s in secrets)]
    codes = [code for _, code, _, _ in runs]
    worked = codes[:8] == [0] * 8 and codes[8] in (0, 1) and codes[9] != 0 and codes[10] != 0
    tracebacks = [name for name, _, out, err in runs if "Traceback" in err]
    ok = worked and not leaks and not tracebacks
    return Outcome("password in every command's --storage", f"{len(runs)} commands (exit {codes}); password in "
                   f"{len(leaks)} outputs/files: {', '.join(leaks)[:80]}", None, None, 0, ok,
                   {"leaks": leaks, "codes": codes, "runs": [(n, c, e[-300:]) for n, c, _, e in runs]})
