"""The engine: turns requests (rows with steers as data) into results.

``LocalEngine`` decodes in-process through a backend's hooks; ``KVCache`` outlives a call.
"""

from steerlab.backends.cache import KVCache
from steerlab.core.request import Completion, Request, Sampling
from steerlab.core.steer import Steer
from steerlab.engine.guard import CallInFlightError

__all__ = ["CallInFlightError", "Completion", "KVCache", "Request", "Sampling", "Steer"]
