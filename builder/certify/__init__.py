"""Certification: run the in-image bench on N nodes through a launcher, judge what the ranks
reported, write the certificate (settings -> run -> verdict -> certificate).

May import: builder.core, builder.recipe, builder.image, builder.launchers (and builder.agent
for its constants only, as every stage may).

Modules: :mod:`.settings` (the lock's settings and the overrides, resolved once),
:mod:`.source` (the image's facts: through the engine, or from a lock), :mod:`.run` (THE
run: :func:`~.run.plan` and :func:`~.run.run`), :mod:`.verdict` (the checks),
:mod:`.certificate` (build and write), :mod:`.model` (the Certificate and Verdict models),
:mod:`.table` (printing), :mod:`.nccl_log` (NCCL INFO lines).
"""
