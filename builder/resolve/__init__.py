"""`envbuild lock`: pin the base image digest, pip hashes and apt versions, then render again."""
