"""Triggers of the Volcano provider."""
