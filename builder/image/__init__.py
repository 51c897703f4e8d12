"""Images on the Docker engine (:mod:`.engine` is the one module that speaks to it): the build, the
base, site options, the content hash, the probe compared with the lock, the no-change build."""
