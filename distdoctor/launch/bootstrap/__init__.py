"""Holds the `sitecustomize` that `distdoctor run` puts first on PYTHONPATH."""
