"""What a serving run is and what it found, in the terms search and plan share.

* :mod:`~tuner.serving.config` — ``ServeConfig`` (the knobs) and ``Deployment`` (model, GPU, layout).
* :mod:`~tuner.serving.load` — ``Load``: the users or the request rate offered.
* :mod:`~tuner.serving.result` — ``RunResult``: what one run measured.
* :mod:`~tuner.serving.slo` — ``SloSet``: the service levels a run meets, and which binds.
* :mod:`~tuner.serving.capacity` — ``CapacityEstimate``: the largest load meeting the target.
* :mod:`~tuner.serving.demand` — what a capacity means for demand, replicas and cost.

Each module is imported by its own path; this file imports nothing.
"""
