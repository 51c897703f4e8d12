"""Images on the Docker engine: the build of rendered files (BuildKit), the base image, site
options, the content hash, and the probe run in an image compared with its lock.

May import: builder.core, builder.recipe, builder.render (reads rendered files),
builder.agent (payload only).
"""
