"""Render a Spec and its resolved pins into a Dockerfile, an Apptainer definition and the lock file."""
