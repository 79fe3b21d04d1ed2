"""The engine: turns requests (rows with steers as data) into results.

``LocalEngine`` decodes in-process through a backend's hooks; ``KVCache`` outlives a call.
"""

from steerlab.engine.cache import KVCache
from steerlab.engine.guard import CallInFlightError
from steerlab.engine.request import Completion, Request, RowSteer, Sampling

__all__ = ["CallInFlightError", "Completion", "KVCache", "Request", "RowSteer", "Sampling"]
