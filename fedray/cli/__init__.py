"""Command-line interface: ``fedray run | tune | dashboard | submit | jobs``."""
