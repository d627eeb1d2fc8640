"""`python -m distdoctor.reference_trainer ...` (see train.py for the runbook)."""

import sys

from .train import main

sys.exit(main())
