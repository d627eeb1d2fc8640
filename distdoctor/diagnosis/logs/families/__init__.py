"""The message families, one module each. A family reads one line at a time and says what
it means as `Signal`s; the first family (in this order) that knows a line wins it, so the
more specific families come first. Tracebacks are followed beside them (exceptions.py).

Adding a family: a module with a `Family` subclass (its anchors and its rules), listed here.
"""

from distdoctor.diagnosis.logs.families.context import ContextFamily
from distdoctor.diagnosis.logs.families.ddp import DdpFamily
from distdoctor.diagnosis.logs.families.exceptions import Tracebacks, UsageErrors
from distdoctor.diagnosis.logs.families.gloo import GlooFamily
from distdoctor.diagnosis.logs.families.launcher import LauncherFamily
from distdoctor.diagnosis.logs.families.mismatch import MismatchFamily
from distdoctor.diagnosis.logs.families.nccl import NcclFamily
from distdoctor.diagnosis.logs.families.oom import OomFamily
from distdoctor.diagnosis.logs.families.progress import ProgressFamily
from distdoctor.diagnosis.logs.families.store import StoreFamily

FAMILIES = (ProgressFamily, LauncherFamily, OomFamily, MismatchFamily, DdpFamily, StoreFamily, NcclFamily,
            GlooFamily, UsageErrors, ContextFamily)

# every byte string some family needs to see a line: the reader skips lines with none
ANCHORS: tuple[bytes, ...] = tuple(sorted({a for f in FAMILIES + (Tracebacks,)
                                           for a in f.anchors}))
