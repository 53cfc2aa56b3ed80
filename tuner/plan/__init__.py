"""Capacity planning: how much traffic does one configuration hold at a P95 TTFT target?

:func:`plan_capacity` takes a configuration (a study's best feasible trial, a chosen
trial, or one given directly), starts it once on a backend, and sweeps the load:

1. **Sweep.** Closed-loop users (default article 004's 5, 10, 20, 50, 80, 120, 160) or
   open-loop Poisson rates, recording mean/P95 TTFT, TPOT, E2E, tokens/s (in+out and
   output) and requests/s per level. The default levels stop at the first one over the
   target (kept: the curve brackets the edge); levels given are all run. While every
   level meets the target the sweep goes on in x1.5 steps (at most ``Sweep.max_extensions``;
   users capped at half the workload, so a run is more than one burst); when the target
   still holds at that cap, a synthetic mix whose size plan chose is doubled (up to
   :data:`~tuner.plan.sweep.MAX_REQUESTS`) and the sweep goes on, so the edge is bracketed
   rather than reported as "at least"; when even the lowest misses it halves down to 1 user.
2. **Interpolate.** The largest load meeting the target by monotone (PCHIP)
   interpolation of P95 TTFT against load (:func:`tuner.serving.capacity.max_load_meeting`).
3. **Verify.** A run at that load (users rounded down), then runs between the last load
   that held and the first that broke (at the monotone fit's crossing, kept a quarter of
   the gap off either end: a bisection at worst) until the two are within the search's edge
   width (5 % of the load, at least one user; the planned trial's tolerance), at most
   :data:`~tuner.plan.sweep.MAX_VERIFY_RUNS`. The answer is the largest load run that held:
   what the search found for the same trial, which a note sets beside it (or says why the
   two differ: other requests, target, SLOs, noise).
4. **Figures.** Conversations per minute, replicas for a demand, cost
   (:mod:`tuner.serving.demand`); ``Sweep.repeats`` > 1 reruns 1-3 with other seeds (another sample
   of the synthetic mix, or 90% of a trace's rows) and gives each figure a (min, max) range.

**Workload.** Plan replays the requests the study searched on: the file it read
(``workload_file`` of the trial's run; never a log path recorded inside a converted file),
or its synthetic mix with more requests (:data:`PLAN_REQUESTS`, a larger sample of the
same distribution). The fingerprint is checked against the trial's: a workload plan
picked itself that is not the study's is refused (InputError); one given on purpose
(``workload=``, ``--trace``) is replayed with a warning. ``CapacityEstimate.workload``
records what was replayed and how it stands to the study's.

The estimate is stored in the study (``plan/trial-<n>/ttft-<t>s``, JSON:
:func:`tuner.serving.capacity.store_plan`) so that notebooks read it back with :func:`load_plan`,
and can be written as Markdown and a PNG (:func:`write_plan_files`).

The package, one noun a module: :mod:`~tuner.plan.planner` (:func:`plan_capacity`, and
:class:`Figures`), :mod:`~tuner.plan.sweep` (the sweep of one started configuration, and
:class:`Sweep`), :mod:`~tuner.plan.workload` (which requests it replays),
:mod:`~tuner.plan.files` (Markdown and PNG). The verb
:func:`tuner.plan` calls :func:`plan_capacity`.

For a backend that runs faster than real time (``tuner sim-serve --speed 20``), its
``time_scale`` of 20 (or ``Sweep.time_scale``) multiplies every measured time by 20 and
divides throughputs by 20 (and offers open-loop rates 20x faster), so the figures are in
the simulated GPU's time.
"""
from __future__ import annotations

from tuner.core.lazy import lazy_exports

#: The package's names, each from the module that defines it (imported on first use).
_WHERE = {
    "CapacityEstimate": "tuner.serving.capacity",
    "SweepPoint": "tuner.serving.capacity",
    "list_plans": "tuner.serving.capacity",
    "plan_key": "tuner.serving.capacity",
    "store_plan": "tuner.serving.capacity",
    "ARTICLE_LEVELS": "sweep",
    "DEFAULT_TARGET_S": "planner",
    "Figures": "planner",
    "MAX_EXTENSIONS": "sweep",
    "PLAN_REQUESTS": "workload",
    "Sweep": "sweep",
    "default_out_dir": "files",
    "find_newest_study": "workload",
    "load_plan": "planner",
    "newest_study": "workload",
    "plan_capacity": "planner",
    "plot_plan": "files",
    "render_markdown": "files",
    "rescale": "sweep",
    "summary_rows": "files",
    "sweep_rows": "files",
    "workload_line": "files",
    "write_plan_files": "files",
}
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)

__all__ = [
    "ARTICLE_LEVELS", "CapacityEstimate", "DEFAULT_TARGET_S", "Figures", "MAX_EXTENSIONS", "PLAN_REQUESTS",
    "Sweep", "SweepPoint", "default_out_dir", "find_newest_study", "list_plans", "load_plan", "newest_study",
    "plan_capacity", "plan_key", "plot_plan", "render_markdown", "rescale", "store_plan", "summary_rows",
    "sweep_rows", "workload_line", "write_plan_files",
]
