"""The search: an Optuna study whose objective is a configuration's *goodput* — the
token throughput (prompt + output tokens/s) at the highest load whose P95 TTFT meets
the target.

Per trial (:func:`evaluate_config`, :mod:`tuner.search.objective`):

1. **Pre-check.** ``backend.precheck`` (the simulator's memory planner, for every
   backend) — a configuration vLLM would refuse is recorded as infeasible with vLLM's
   reason and costs no launch.
2. **Start** the deployment (a refused start is recorded the same way).
3. **Goodput search** over the load (closed-loop users, a Poisson rate, or the trace's
   rate multiplier), at most ``max_replays`` replays: the first at the most load the
   configuration can hold (max-num-seqs x replicas, capped by its KV cache and the
   workload size); on a miss, the next load is interpolated from the P95 TTFT measured,
   then bisected. A replay stops early once more than 5% of all its requests have already
   exceeded the target (P95 cannot recover), or once more than 1% of them have failed
   (``MAX_ERROR_RATE``: an HTTP error, a timeout, a broken or short stream); that load
   point fails. If every load point fails, the trial is infeasible, with the evidence
   stored; when errors failed the lowest load, the reason names them (``400 of 400
   requests failed at 64 users: http_429 x400``), never a latency. Refining also stops
   once even the failing load could not beat the study's best trial (Little's law bound).

The P95 TTFT constraint (one per SLO) goes to the sampler as an Optuna constraint through
Optuna's public paths (:mod:`~tuner.search.constraints`: a ``constraints_func`` for TPE and
GP, ``Trial.set_constraint`` otherwise; optuna-dashboard reads it), so it learns the
feasible region. Infeasible
configurations are COMPLETE trials with value 0 and a positive constraint; a backend
crash marks only that trial FAIL and the study goes on. A configuration the sampler
proposes again is not relaunched: the trial copies the earlier result (``repeat_of``).
A new TPE/GP study first runs vLLM's defaults at each layout (:func:`default_trials`).

Stored per trial (``trial.user_attrs``, written and read as a
:class:`~tuner.study.record.TrialRecord`): ``config``, ``feasible``, ``constraint``,
``tokens_per_s``, ``output_tokens_per_s``, ``summary`` (every percentile of the chosen
load point), ``server`` (server readings), ``loads`` (every load point tried, each with
its ``errors``), ``errors`` (failed requests per kind at the chosen load, or at the
lowest load when infeasible; ``error_detail`` the first message of each kind),
``failed_by`` (``errors`` or ``latency``, for an infeasible trial that ran),
``infeasible_reason``, ``gpu_s`` (startup + replay seconds; simulated for the
simulator), ``run`` (workload fingerprint, backend, vLLM version, hardware, seed,
sampler, log paths, plan facts).

The package, one noun a module, each importing only those below it:

* :mod:`~tuner.search.run` — :func:`run_search`; :mod:`~tuner.search.driver` — its
  :class:`SearchRun`: the study, resume, workers, on a run opened by
  :mod:`~tuner.search.setup`, each trial a :mod:`~tuner.search.trial`, all sharing one
  :class:`~tuner.search.context.TrialContext` (:mod:`~tuner.search.context`;
  :mod:`~tuner.search.settings`, :mod:`~tuner.search.outcome` what it takes and leaves);
* :mod:`~tuner.search.confirm` — the winner's repeat measurements (decided by
  :mod:`tuner.study.race`);
* :mod:`~tuner.search.pruning` and :mod:`~tuner.search.prediction` — the simulator as
  predictor: start loads, pruning, proposals;
* :mod:`~tuner.search.objective` — one configuration's score;
* :mod:`~tuner.search.goodput` — the load search of one started configuration;
* :mod:`~tuner.search.defaults`, :mod:`~tuner.search.samplers`,
  :mod:`~tuner.search.inputs`, :mod:`~tuner.search.records`,
  :mod:`~tuner.search.progress`, :mod:`~tuner.search.command` — vLLM's defaults as first
  trials, the samplers, backend and workload, what is recorded around a trial, Optuna
  kept quiet, the ``vllm serve`` line;
* :mod:`~tuner.search.workflow` — :func:`search`, what ``tuner search`` does as one call
  (space, deployment, workload, backend, study): the verb :func:`tuner.search` calls it;
  :mod:`~tuner.search.backend` — the protocol a backend meets;
* :mod:`~tuner.search.recipe` — the winner handed to deployment (``--recipe``).
"""
from __future__ import annotations

from tuner.core.lazy import lazy_exports

#: The package's names, each from the module that defines it (imported on first use).
_WHERE = {
    "CONFIRM_ROUNDS": "confirm",
    "CONSTRAINT": "objective",
    "EDGE_TOLERANCE": "goodput",
    "Evaluation": "objective",
    "MAX_ERROR_RATE": "goodput",
    "MAX_REPLAYS": "goodput",
    "N_STARTUP_TRIALS": "samplers",
    "Prepared": "workflow",
    "SAMPLERS": "samplers",
    "SearchOutcome": "outcome",
    "SearchRun": "driver",
    "SearchSettings": "settings",
    "backend_for": "workflow",
    "build_workload": "inputs",
    "confirm_winner": "confirm",
    "default_trials": "defaults",
    "edge_width": "goodput",
    "error_stop_hook": "goodput",
    "evaluate_config": "objective",
    "get_backend_by_name": "inputs",
    "load_for": "goodput",
    "make_sampler": "samplers",
    "max_users": "goodput",
    "monotone_crossing": "goodput",
    "num_heads": "inputs",
    "planner_precheck": "objective",
    "prepare": "workflow",
    "run_search": "run",
    "search": "workflow",
    "serve_command": "command",
    "slo_stop_hook": "goodput",
    "study_noise": "confirm",
    "warm_start_configs": "run",
    "workload_facts": "inputs",
}
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)

__all__ = [
    "CONFIRM_ROUNDS", "CONSTRAINT", "EDGE_TOLERANCE", "Evaluation", "MAX_ERROR_RATE", "MAX_REPLAYS",
    "N_STARTUP_TRIALS", "Prepared", "SAMPLERS", "SearchOutcome", "SearchRun", "SearchSettings", "backend_for",
    "build_workload", "confirm_winner", "default_trials", "edge_width", "error_stop_hook", "evaluate_config",
    "get_backend_by_name", "load_for", "make_sampler", "max_users", "monotone_crossing", "num_heads",
    "planner_precheck", "prepare", "run_search", "search", "serve_command", "slo_stop_hook", "study_noise",
    "warm_start_configs", "workload_facts",
]
