"""The shared vocabulary every part of tuner speaks; nothing here imports another part.

* :mod:`~tuner.core.errors` — one error root (:class:`~tuner.core.errors.TunerError`) and its kinds.
* :mod:`~tuner.core.values` — value checks; :mod:`~tuner.core.units` — durations.
* :mod:`~tuner.core.versions` — vLLM versions; :mod:`~tuner.core.knobs` — the knob table (``KNOBS``).
* :mod:`~tuner.core.jsonsafe` — JSON cleaning; :mod:`~tuner.core.yamlfile` — YAML with line numbers.
* :mod:`~tuner.core.urls` — credential masking; :mod:`~tuner.core.files` — atomic writes.

Each module is imported by its own path; this file imports nothing.
"""
