"""The scenarios record.py runs, in the order it lists them (the fixtures' README and
expected.json), and the ground truth for each. What a scenario is: scenario_spec.py."""

from scenarios_comms import COMMS
from scenarios_crashes import CRASHES
from scenarios_healthy import HEALTHY
from scenarios_subtle import SUBTLE

SCENARIOS = [*CRASHES, *COMMS, *SUBTLE, *HEALTHY]
