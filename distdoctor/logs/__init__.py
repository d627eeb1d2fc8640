"""Failures read from a job's output: what `distdoctor diagnose --log` and `distdoctor run`'s
live scan of the output find.

  lines.py     one line of output: prefixes (rank, launcher, glog, Ray, mpirun, srun), ANSI
  colours.py   colour codes, with their ESC or without it (lost in a copy)
  files.py     which files a spec names (paths, globs, .gz) and what their names say
  decoded.py   a file's bytes as UTF-8 text: gzip inflated (kept when cut short or corrupt),
               UTF-16 decoded
  bounds.py    what a log can make the reader search, parse, hold and print, bounded
  wraps.py     hard-wrapped lines found and rejoined
  reader.py    only lines holding an anchor parsed (fast); every line counted per process
  families/    one module per family of messages: what a line means (`Signal`s), and what
               its problems mean (findings)
  problems.py  problems, the evidence beyond them, the words findings are made of
  reasoning.py across ranks: the first failure is the cause, the rest its consequences;
               with exits.py (the launcher's reports), restarts.py (torchelastic restarts)
               and fallback.py (an error line no family knows: never silence)
  scanner.py   lines in, findings out (live and post-mortem)
  window.py    whether a log starts mid-run (then absence from it proves nothing)
  heads.py     line heads no rule knows, learned from the log itself
  repeats.py   a log that ends in one line over and over with nothing moving: a stall
  remedies.py  what to try
  story.py     the job's story (launch, init, steps, eval, save, the end) from each file's
               head and tail, read after the line pass: where a failure happened
  ending.py    how the log ends (finished, failed, stopped with no error, killed from
               outside, cut off): never silence on a log that ends early
  before.py    cause before symptom: what the same process printed just before the error

Layer: detectors (tests/test_layers.py), beside distdoctor/diagnosis: it reads text and
needs no run dir. May import the findings (distdoctor/findings.py) and the base modules
(errors, exits). Never distdoctor/diagnosis (whose live loop feeds this package the job's
output), a view or a front end.
"""

from __future__ import annotations

from distdoctor.errors import UserError
from distdoctor.findings import Finding
from distdoctor.safetext import printable


def scan_logs(specs: list[str], anchors: tuple[bytes, ...] | None = None
              ) -> tuple[list[Finding], str]:
    """`diagnose --log`: the findings of the logs `specs` names (paths, globs, .gz) and one
    line saying what was read. `anchors`: what the reader hands over (the default: the
    families' short cover)."""
    from distdoctor.logs.before import causes_first
    from distdoctor.logs.bounds import MAX_TEXT, MAX_TRACKED, shown
    from distdoctor.logs.ending import annotate, verdict
    from distdoctor.logs.families import ANCHORS
    from distdoctor.logs.reader import LogReader
    from distdoctor.logs.repeats import stall_signals, stall_signals_of_tails
    from distdoctor.logs.scanner import LogScanner
    from distdoctor.logs.story import read_story
    from distdoctor.logs.survived import trained_past
    from distdoctor.logs.window import starts_mid_run, window_note

    reader = LogReader(specs)
    scanner = LogScanner()
    for line in reader.lines(anchors or ANCHORS):
        scanner.feed_line(line)
    if reader.damaged and not reader.total_lines:  # nothing read at all: the user's to fix
        path, why = next(iter(reader.damaged.items()))
        raise UserError(f"diagnose: cannot read log {printable(path, 300)}: {why}", 2)
    scanner.activity = reader.activity
    scanner.file_lines = reader.file_lines
    scanner.mid_run = starts_mid_run(reader.first_text)
    # the whole log's reading, on the bounded windows the story keeps (never per line); the
    # tails it parsed serve the stall check too (files past its limit are read for that)
    story = read_story(reader.files, reader.file_lines, reader.heads)
    story.mid_run = scanner.mid_run
    rest = [p for p in reader.files if p not in story.files]
    scanner.repeats = stall_signals_of_tails(
        {p: list(zip(fs.tail, fs.tail_raw, strict=True)) for p, fs in story.files.items()}
    ) + (stall_signals(rest, reader.file_lines, reader.heads) if rest else [])
    found = scanner.findings()
    try:  # the story's reading adds to the findings; a fault in it must not lose them
        causes_first(found, story, scanner.first_lines, scanner.signals)
        trained_past(found, story, scanner.first_lines, scanner.signals)
        annotate(found, story, scanner.first_lines)
        ending, said = verdict(found, story, reader.truncated)
    except Exception as exc:  # noqa: BLE001 (contained here, said in the read line)
        ending, said = f"not judged (internal error: {type(exc).__name__})", None
    if said is not None:
        found.append(said)
    read = scanner.read_summary(reader.total_lines)
    if scanner.mid_run:
        read += window_note(reader.first_text)
    if reader.wrapped_width:
        read += f" (lines wrapped at {reader.wrapped_width} columns rejoined)"
    if reader.untracked_lines:
        read += (f" (past {MAX_TRACKED:,} processes, {reader.untracked_lines:,} lines of the "
                 f"others counted, not told apart)")
    for path, why in reader.damaged.items():
        read += f" ({printable(path, 300)}: {why}; read up to there)"
    if reader.truncated and reader.files[-1] not in reader.damaged:
        read += " (the log ends mid-line: it was cut off)"
    read += f"; how it ends: {ending}"
    # what the log wrote reaches every output as text, bounded (bounds.shown)
    return [shown(f) for f in found], printable(read, 4 * MAX_TEXT)
