"""The Docker engine: build, base bootstrap, site options, content hash, probe vs lock.
"""
