"""A local Volcano-compatible project-locks server."""
