"""A user's own package of fedray plug-ins (see docs/writing_an_algorithm.md): not part of fedray."""
