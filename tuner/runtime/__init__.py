"""Process and run control: how a run is stopped, watched and routed.

* :mod:`~tuner.runtime.interrupts` — stop signals and deadlines.
* :mod:`~tuner.runtime.processes` — tuner's marker on the servers it starts.
* :mod:`~tuner.runtime.control` — ``RunControl``/``StopHook``: a run's live view, and how a caller stops it.
* :mod:`~tuner.runtime.routing` — the replica ``Router``.
* :mod:`~tuner.runtime.kernel_time` — kernel receive stamps.
* :mod:`~tuner.runtime.progress` — the progress ``Observer`` (``None`` is headless).

Each module is imported by its own path; this file imports nothing.
"""
