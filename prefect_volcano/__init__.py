"""Prefect integration for Volcano project locks."""
