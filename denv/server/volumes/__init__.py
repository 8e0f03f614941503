"""Volumes: overlays over immutable layers, size-limited filesystems, mounts, layer
packing and diffs, and the object store that makes versions durable.

A leaf: knows neither the Docker node nor the cluster.
"""
