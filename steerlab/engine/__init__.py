"""The engine: turns requests (rows with steers as data) into results.

``LocalEngine`` decodes in-process through a backend's hooks; ``KVCache`` outlives a call.
"""

from steerlab.backends.cache import KVCache
from steerlab.core.request import Completion, Request, RowSteer, Sampling
from steerlab.engine.guard import CallInFlightError

__all__ = ["CallInFlightError", "Completion", "KVCache", "Request", "RowSteer", "Sampling"]
