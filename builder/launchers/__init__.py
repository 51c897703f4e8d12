"""Launchers: start N ranks of the in-image bench somewhere (local Docker, Slurm, Kubernetes) and collect what they
print, checked against the run.

May import: builder.core, builder.recipe (models), builder.image, builder.agent (payload only).

:mod:`.base` holds what every launcher shares (:class:`LaunchSpec`, :class:`LaunchResult`, the :class:`Launcher`
protocol, torchrun argv, node environment, labels, socket settings, the in-image code); :mod:`.model` the rank result
model; :mod:`.output` the reading and checking of what nodes print; :mod:`.progress` progress tracking and hang naming;
:mod:`.local`, :mod:`.slurm` and :mod:`.k8s` the launchers.
"""

from .base import Launcher, LaunchResult, LaunchSpec, OnProgress

__all__ = ["LaunchResult", "LaunchSpec", "Launcher", "OnProgress"]
