"""Run a callback once, a short delay after the last of a burst of triggers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Debouncer:
    """Call ``fn(*args)`` ``delay`` seconds after the last ``trigger``; earlier ones are dropped.

    A ``threading.Timer`` per trigger, cancelled by the next one, so it works whatever event
    loop the kernel runs. ``delay == 0`` calls ``fn`` at once in the caller's thread, which
    makes tests synchronous. A timer that already fired cannot be cancelled: the callback must
    check for itself that its work is still wanted (the panel compares request ids).

    >>> calls = []
    >>> d = Debouncer(calls.append, delay=0)
    >>> d.trigger(1); calls
    [1]
    """

    def __init__(self, fn: Callable[..., Any], delay: float) -> None:
        if delay < 0:
            raise ValueError(f"delay must be >= 0 seconds; got {delay}.")
        self._fn = fn
        self.delay = delay
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def trigger(self, *args: Any) -> None:
        if self.delay == 0:
            self._fn(*args)
            return
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self.delay, self._fn, args)
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the latest timer has fired and its callback returned; True if it did."""
        with self._lock:
            timer = self._timer
        if timer is None:
            return True
        timer.join(timeout)
        return not timer.is_alive()
