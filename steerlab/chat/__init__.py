"""Chat sessions that keep their KV cache from turn to turn, keyed on the steering.

``lm.chat(system=...)`` gives a ``ChatSession``; see ``session.py`` for what it does,
``encoding.py`` for how turns are encoded, ``key.py`` for when a cache is reused.
"""

from steerlab.chat.key import CacheKey
from steerlab.chat.session import ChatSession
from steerlab.chat.turns import TurnLog, TurnStats
from steerlab.model import provide

__all__ = ["CacheKey", "ChatSession", "TurnLog", "TurnStats"]

provide("chat", ChatSession)  # lm.chat(...), without the facade importing this package
