"""Each task's operation, the API side of the task, one module each: its parameters as one typed dataclass (their
schema and defaults declared once), the one place its core request is built (`request`), its answer (`answer`), and
the routes and KServe tensors it serves beyond /predict. Every API family renames its body into /predict's
parameters and goes through these two doors; infinity/api/__init__.py holds the registry."""
