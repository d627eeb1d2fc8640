"""The Textual dashboard (`distdoctor watch`), installed as `distdoctor.tui`.

`command.py` (the `watch` subcommand, registered through the `distdoctor.commands` entry
point), `app.py` (the app), `cells.py` (how a snapshot's values are drawn).

Layer: front ends (tests/test_layers.py). May import the views it draws, the detectors'
live loop it runs, the other front ends it serves through (the collector, /metrics, the
CLI's shared arguments) and everything below. Nothing in distdoctor/ imports it: the core
finds it through entry points (distdoctor/plugins.py).
"""
