"""Reporting a study: the HTML report (:mod:`~tuner.report.html`, ``tuner report``) and
CSV/JSON export (:mod:`~tuner.report.export`, ``tuner export``).

Each module is imported by its own path; this file imports nothing.
"""
