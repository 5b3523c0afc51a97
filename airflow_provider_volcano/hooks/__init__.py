"""Hooks of the Volcano provider."""
