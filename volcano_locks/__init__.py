"""Volcano project locks: the shared core client, lease keeper and local server."""
