"""The ``vllm`` backend: start real ``vllm serve`` processes for a trial, replay the load
against them, stop them, and leave nothing behind.

vLLM is never imported here: each replica is a separate process (its own session and
process group, so a crash cannot take the study down and teardown reaches every worker
it spawned), started from ``vllm_cmd`` (default ``vllm serve``; e.g. ``"docker run --rm
--gpus all -p ... vllm/vllm-openai"`` or ``"python -m tuner sim-serve"``) split with
:func:`shlex.split`, then the model, then flags rendered for the vLLM version
(:mod:`tuner.backends.vllm_args`). A ``{model}`` placeholder in ``vllm_cmd`` puts the
model there instead of right after the command.

Replica ``k`` gets GPUs ``devices[k*TP:(k+1)*TP]`` as ``CUDA_VISIBLE_DEVICES``, a free
port, and a log at ``<log_dir>/<trial>-r<k>.log``. Start = spawn all, wait for
``/health`` (``startup_timeout_s``), one tiny warm-up completion, read the startup facts
from the log and ``/metrics``. A failed start raises :class:`ConfigRejected` with the cause
classified from exit code and log, or :class:`~tuner.core.errors.EnvironmentFault` when the
machine is at fault (a port another process took, retried on a new port; a full disk; a
flag the server rejects; no such command). Stop = SIGTERM to each process group, SIGKILL
after ``stop_grace_s``; only groups this backend created are signalled.

Each replica carries tuner's marker (:mod:`tuner.runtime.processes`): the environment variable
``TUNER_SERVER`` and a second served model name ``tuner-<token>``. A trial replays only
against a port whose ``/v1/models`` lists its token, so a process that happens to answer
``/health`` on the chosen port is reported, never measured. Servers are asked to die
with the tuner process (Linux ``PR_SET_PDEATHSIG``), every live one is stopped by
:func:`stop_all` on the CLI's way out, and a watchdog (:mod:`tuner.backends.reaper`) stops
their whole process groups when this process ends by any means, SIGKILL included, also
behind a launcher script that does not ``exec`` the server. What is left even so (the
watchdog killed too) a later run finds by the marker and stops (``report_stale_servers``).

The pieces beside this module: :mod:`tuner.backends.vllm_instance` (a trial's running
replicas), :mod:`tuner.backends.vllm_replica` (one server process, and every live one),
:mod:`tuner.backends.vllm_ready` (a started replica's way to serving: health, marker, warm-up),
:mod:`tuner.backends.vllm_command` (what a command line runs),
:mod:`tuner.backends.log_folder` (the log folder's check) and
:mod:`tuner.backends.local_server` (free ports, test servers, small HTTP calls).
"""
from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.backends import gpu_memory
from tuner.backends.local_server import free_port
from tuner.backends.log_folder import check_writable
from tuner.backends.vllm_args import parse_startup, place_model, render_flags
from tuner.backends.vllm_command import detect_version, sim_serve_speed
from tuner.backends.vllm_cpu import CpuPlatform, resolve_platform
from tuner.backends.vllm_instance import VllmInstance
from tuner.backends.vllm_ready import metrics_facts, served_model, wait_healthy, warm_up
from tuner.backends.vllm_replica import _LIVE, _Replica, server_tmpdir
from tuner.core.errors import ConfigRejected, EnvironmentFault, InputError
from tuner.runtime import processes

if TYPE_CHECKING:
    from tuner.serving.config import Deployment, ServeConfig


DEFAULT_CMD = "vllm serve"
#: Defaults of the start and per-request timeouts (``--startup-timeout``, ``--request-timeout``):
#: a 70B model over a slow disk can take ~20 minutes to load and capture graphs; one request
#: of a long-context trace at saturation a few minutes.
STARTUP_TIMEOUT_S = 1800.0
REQUEST_TIMEOUT_S = 600.0
#: Attempts at a start whose port another process took in the meantime.
PORT_ATTEMPTS = 3


class VllmBackend:
    """Starts ``vllm serve`` replicas per trial. Constructor arguments:

    * ``vllm_cmd``: command before the model (default ``vllm serve``), split with shlex.
    * ``vllm_version``: skips detection; else :func:`detect_version`, else the
      deployment's ``vllm_version``.
    * ``log_dir``: where ``<trial>-r<k>.log`` go (``studies/<study>/logs``).
    * ``host``: address replicas bind and the client uses (default 127.0.0.1).
    * ``startup_timeout_s``: time for ``/health`` to answer (model load + graphs).
    * ``stop_grace_s``: SIGTERM → SIGKILL grace.
    * ``extra_args``: flags appended to every replica (e.g. ``["--trust-remote-code"]``).
    * ``env``: extra environment variables for the replicas.
    * ``router``, ``timeout_s``, ``api``, ``metrics``: passed to :func:`tuner.replay.replay`.
    * ``platform``: ``cuda``, ``cpu`` (the vllm-cpu build: no ``CUDA_VISIBLE_DEVICES``, KV
      size through ``VLLM_CPU_KVCACHE_SPACE``; see :mod:`tuner.backends.vllm_cpu`) or
      ``auto`` (``cpu`` when the command's Python has vllm-cpu installed).
    * ``cpu``: the :class:`~tuner.backends.vllm_cpu.CpuPlatform` (host GiB for the KV cache
      at utilisation 1; default ``$TUNER_CPU_KV_GIB`` or 4).
    """

    name = "vllm"
    restarts = True
    measures_gpu_time = True
    launched_at: float | None = None  # set by each start

    def __init__(
        self,
        *,
        vllm_cmd: str | None = None,
        vllm_version: str | None = None,
        log_dir: str | Path = "studies/default/logs",
        host: str = "127.0.0.1",
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        stop_grace_s: float = 30.0,
        extra_args: list[str] | tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        router: str = "round_robin",
        timeout_s: float = REQUEST_TIMEOUT_S,
        api: str = "completions",
        metrics: bool = True,
        platform: str = "auto",
        cpu: CpuPlatform | None = None,
    ) -> None:
        self.vllm_cmd = vllm_cmd or DEFAULT_CMD
        if not shlex.split(self.vllm_cmd):
            raise InputError("--vllm-cmd is empty", hint='e.g. "vllm serve" or "python -m tuner sim-serve"')
        self.vllm_version = vllm_version
        self.log_dir = Path(log_dir)
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self._replay = {"router": router, "timeout_s": timeout_s, "api": api, "metrics": metrics}
        self._detected: str | None = None
        self._trial_counter = 0
        self._platform = platform
        self.cpu = cpu or CpuPlatform(kv_memory_gib=float(os.environ.get("TUNER_CPU_KV_GIB", "4")))

    def platform(self) -> str:
        """``cuda`` or ``cpu`` (resolved once, see the class docstring)."""
        if self._platform == "auto":
            self._platform = resolve_platform("auto", shlex.split(self.vllm_cmd))
        return self._platform

    # -- facts ---------------------------------------------------------------------------
    @property
    def simulated(self) -> bool:
        """The command is ``tuner sim-serve`` (the simulator behind real processes and HTTP)."""
        return sim_serve_speed(shlex.split(self.vllm_cmd)) is not None

    @property
    def time_scale(self) -> float:
        """``tuner sim-serve --speed N`` runs N times faster than the GPU it simulates."""
        return sim_serve_speed(shlex.split(self.vllm_cmd)) or 1.0

    def version(self, deployment: Deployment) -> str:
        if self.vllm_version:
            return self.vllm_version
        if self._detected is None:
            self._detected = detect_version(self.vllm_cmd) or ""
        return self._detected or deployment.vllm_version

    def layout(self, deployment: Deployment, config: ServeConfig) -> list[str]:
        """``CUDA_VISIBLE_DEVICES`` per replica; ConfigRejected ``layout`` if the GPUs do not suffice."""
        devices = list(deployment.devices)
        tp, n = config.tensor_parallel_size, config.replicas
        if tp * n > len(devices):
            raise ConfigRejected(
                "layout",
                f"{n} replica(s) x tensor-parallel {tp} needs {tp * n} GPUs, "
                f"{len(devices)} given ({','.join(map(str, devices))})",
            )
        return [",".join(str(d) for d in devices[k * tp:(k + 1) * tp]) for k in range(n)]

    def precheck(self, deployment: Deployment, config: ServeConfig) -> dict[str, Any]:
        """Checks the GPU layout only (the real server decides the rest at start)."""
        self.layout(deployment, config)
        return {}

    def preflight(self, deployment: Deployment) -> None:
        """What must hold before the first trial, checked without starting anything:
        the command exists and the log folder is writable with room to spare. Raises
        :class:`EnvironmentFault` (the run stops before any trial is recorded)."""
        cmd = shlex.split(self.vllm_cmd)
        exe = cmd[0]
        found = shutil.which(exe) if os.sep not in exe else (exe if os.access(exe, os.X_OK) else None)
        if found is None:
            raise EnvironmentFault("command", f"--vllm-cmd {self.vllm_cmd!r}: {exe!r} is not an executable "
                                   "on PATH", path=exe)
        check_writable(self.log_dir, what="the vLLM log folder")

    def _served_names(self, deployment: Deployment, token: str) -> list[str]:
        """``--served-model-name`` flags: the name vLLM would use by default, then the
        trial's marker (so ``/v1/models`` proves the server is ours); none when the user
        names the model in --extra-args or --vllm-cmd."""
        if any(a == "--served-model-name" or a.startswith("--served-model-name=")
               for a in [*shlex.split(self.vllm_cmd), *self.extra_args]):
            return []
        return ["--served-model-name", deployment.model, processes.NAME_PREFIX + token]

    def argv(self, deployment: Deployment, config: ServeConfig, *, port: int, version: str,
             token: str = "") -> list[str]:
        head = place_model(shlex.split(self.vllm_cmd), deployment.model)
        flags = render_flags(deployment, config, version, host=self.host, port=port)
        if self.simulated:
            # the simulated server also needs the GPU type and the version it follows
            flags += ["--gpu", deployment.gpu, "--vllm-version", version]
        if token:
            flags += self._served_names(deployment, token)
        return head + flags + self.extra_args

    # -- start ---------------------------------------------------------------------------
    def start(self, deployment: Deployment, config: ServeConfig, *, trial: str | None = None) -> VllmInstance:
        """Start ``config.replicas`` replicas and wait until all answer; ConfigRejected if
        vLLM refuses, :class:`EnvironmentFault` for a fault of the machine (after
        :data:`PORT_ATTEMPTS` tries when another process took a port)."""
        gpu_sets = self.layout(deployment, config)
        version = self.version(deployment)
        self._trial_counter += 1
        trial = trial or f"trial{self._trial_counter:04d}-{os.getpid()}"
        check_writable(self.log_dir, what="the vLLM log folder")
        self.check_gpus_free(gpu_sets)
        self.launched_at = time.monotonic()  # the GPUs are held from here (what a failed trial throws away)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                return self._start_once(deployment, config, gpu_sets, version,
                                        trial if attempt == 1 else f"{trial}-a{attempt}")
            except EnvironmentFault as err:
                if not err.retry or attempt == PORT_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def check_gpus_free(self, gpu_sets: list[str]) -> None:
        """No process but this run's servers holds memory on the GPUs a start needs
        (:mod:`tuner.backends.gpu_memory`; nothing to check without nvidia-smi, on the CPU
        build or for ``tuner sim-serve``); else :class:`EnvironmentFault` ``gpu_busy``
        naming them."""
        if self.simulated or self.platform() == "cpu":
            return
        gpus = sorted({int(g) for s in gpu_sets for g in s.split(",") if g.strip().isdigit()})
        foreign = gpu_memory.foreign_holders(gpus, {r.pgid for r in _LIVE})
        if foreign:
            raise EnvironmentFault("gpu_busy", "; ".join(h.describe() for h in foreign[:4]) + ", not a server of this "
                                   "run: stop it (tuner doctor lists GPU holders) or give --gpus GPUs that are free")

    def _start_once(self, deployment: Deployment, config: ServeConfig, gpu_sets: list[str], version: str,
                    trial: str) -> VllmInstance:
        t_start = time.monotonic()
        replicas: list[_Replica] = []
        try:
            for k, gpus in enumerate(gpu_sets):
                replicas.append(self._spawn(deployment, config, version, gpus, self.log_dir / f"{trial}-r{k}.log"))
            limits = (self.startup_timeout_s, self.stop_grace_s)
            for r in replicas:
                wait_healthy(r, t_start, *limits)
            model_name = served_model(replicas[0])
            for r in replicas:
                warm_up(r, model_name, t_start, self.startup_timeout_s)
        except BaseException:
            for r in replicas:
                r.stop(self.stop_grace_s)
            raise
        startup_s = time.monotonic() - t_start
        facts = parse_startup(replicas[0].log_text())
        facts.update(metrics_facts(replicas[0]))
        info: dict[str, Any] = {
            **facts,
            "startup_s": startup_s,
            "vllm_version": version,
            "model_name": model_name,
            "argv": [r.argv for r in replicas],
            "log_paths": [str(r.log_path) for r in replicas],
            "endpoints": [r.url for r in replicas],
            "cuda_visible_devices": gpu_sets,
            "platform": self.platform(),
        }
        return VllmInstance(self, replicas, info)

    def _spawn(self, deployment: Deployment, config: ServeConfig, version: str, gpus: str,
               log_path: Path) -> _Replica:
        """Launch one replica on ``gpus`` (a free port, tuner's marker token, a temporary
        folder of its own, its log at ``log_path``); :class:`EnvironmentFault` when the log
        cannot be written or the command cannot run."""
        port = free_port(self.host)
        token = secrets.token_hex(6)
        argv = self.argv(deployment, config, port=port, version=version, token=token)
        # VLLM_API_KEY would make the server demand a key tuner does not send (and
        # /v1/models answer 401 to the check that the server is ours)
        inherited = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
        tmp = server_tmpdir()
        env = {**inherited, "TMPDIR": str(tmp), "VLLM_RPC_BASE_PATH": str(tmp), **self.env,
               "CUDA_VISIBLE_DEVICES": gpus, "PYTHONUNBUFFERED": "1",
               processes.MARKER_ENV: processes.marker(token)}
        where = f"CUDA_VISIBLE_DEVICES={gpus}"
        if self.platform() == "cpu":
            env = self.cpu.env(config, env)
            where = f"cpu: VLLM_CPU_KVCACHE_SPACE={env['VLLM_CPU_KVCACHE_SPACE']}"
        try:
            log = open(log_path, "wb")
            with log:
                log.write(f"# tuner: {shlex.join(argv)}\n# {where}\n".encode())
                log.flush()
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=env, start_new_session=True, preexec_fn=processes.die_with_parent)
        except OSError as err:
            shutil.rmtree(tmp, ignore_errors=True)
            if getattr(err, "filename", None) is None or str(err.filename) == str(log_path):
                raise EnvironmentFault("disk_full" if err.errno == 28 else "storage",
                                       f"cannot write the vLLM log {log_path}: {err.strerror}",
                                       path=str(log_path)) from err
            raise EnvironmentFault("command", f"cannot run {argv[0]!r}: {err.strerror} (check --vllm-cmd)",
                                   path=argv[0]) from err
        return _Replica(proc, f"http://{self._client_host()}:{port}", log_path, argv, gpus,
                        token=token, port=port, tmpdir=tmp)

    def _client_host(self) -> str:
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
