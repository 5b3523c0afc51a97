"""TaskFlow decorators of the Volcano provider."""
