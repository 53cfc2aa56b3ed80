"""Running tuner on a schedule and keeping its host sound: the nightly run
(:mod:`~tuner.ops.nightly`, ``tuner nightly``) and the host's check (:mod:`~tuner.ops.doctor`,
``tuner doctor``).

Each module is imported by its own path; this file imports nothing.
"""
