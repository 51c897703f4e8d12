"""Images on the Docker engine: the build of rendered files (BuildKit), the base image, site
options and the indexes a build asks, the content hash, the probe run in an image compared with
its lock, and the no-change build decided from image IDs (reuse, probecache, engineapi).

May import: builder.core, builder.recipe, builder.render (reads rendered files),
builder.agent (payload only).
"""
