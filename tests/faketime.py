"""A real process's wall clock, stepped from outside with libfaketime (Debian's ``faketime``):
``SteppedClock`` and ``library``, kept in ``bench/_support.py`` (the chaos bench steps clocks as
the tests do, without the test tree)."""

from __future__ import annotations

from bench._support import SteppedClock, library

__all__ = ["SteppedClock", "library"]
