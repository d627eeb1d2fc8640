"""A hybrid-parallel GPT trainer, installed as `distdoctor.reference_trainer`.

    python -m distdoctor.reference_trainer --help       # flags and the torchrun runbook
    from distdoctor.reference_trainer import main
    main(["--dp", "2", "--steps", "5"])                 # -> exit code (run under torchrun env)

Importing this package does not import torch; `main` does.

Layer: front ends (tests/test_layers.py). May import the Python API (`distdoctor.trace`)
and the launcher's environment helpers; it is a job like a user's, and nothing but the
CLI's `demo` imports it.
"""


def main(argv: list[str] | None = None) -> int:
    from .train import main as _main

    return _main(argv)


__all__ = ["main"]
