"""Operators of the Volcano provider."""
