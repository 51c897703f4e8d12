"""Launchers: start N ranks of the in-image bench somewhere and collect their results.

:mod:`.base` holds the interface (plain data: :class:`LaunchSpec`, :class:`LaunchResult`,
the :class:`Launcher` protocol); :mod:`.local` runs one Docker container per simulated
node on the local engine.
"""

from .base import LaunchResult, LaunchSpec, Launcher, OnProgress

__all__ = ["LaunchResult", "LaunchSpec", "Launcher", "OnProgress"]
