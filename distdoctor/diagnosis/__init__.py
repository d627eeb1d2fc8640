"""Diagnosis: detectors over the ranks' event streams, and the findings they produce.

Detectors are pure functions of the events (plus process exits and log text), so the same
code serves the live engine in `distdoctor run` and the post-mortem `distdoctor diagnose`.
"""
