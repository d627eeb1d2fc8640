"""The job's output passes through distdoctor byte for byte, one whole line at a time."""

from __future__ import annotations

import io
import os
import threading
import time

import pytest

from distdoctor.launch.local import _forward


class Sink(io.BytesIO):
    """Our stdout: records each write, so a test can see what went out together."""

    def __init__(self):
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data):
        self.writes.append(bytes(data))
        return super().write(data)


def _forwarder(sink, rank, seen):
    r, w = os.pipe()
    src = os.fdopen(r, "rb", buffering=0)
    t = threading.Thread(target=_forward, args=(src, sink, rank, lambda *a: seen.append(a)),
                         daemon=True)
    t.start()
    return w, t


@pytest.mark.timeout(20)
def test_a_line_written_in_pieces_is_not_cut_by_another_ranks_line(monkeypatch):
    # the tail waits 1 s, not 50 ms, for the rest of its line: on a loaded machine this
    # thread's 10 ms sleeps can last longer than 50 ms (what is tested is the holding)
    monkeypatch.setattr("distdoctor.launch.local.HOLD_TAIL_S", 1.0)
    sink, seen = Sink(), []
    w0, t0 = _forwarder(sink, 0, seen)
    w1, t1 = _forwarder(sink, 1, seen)
    os.write(w0, "rank 0 \u00e9".encode())  # print() writes the text, then the newline
    time.sleep(0.01)
    os.write(w1, b"rank 1 line\n")
    time.sleep(0.01)
    os.write(w0, b"\n")
    os.write(w0, b"50%\r100%\n")
    os.write(w0, b"prompt> ")  # no line end: written once quiet
    deadline = time.monotonic() + 5
    while b"prompt> " not in sink.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b"prompt> " in sink.getvalue()
    os.close(w0)
    os.close(w1)
    t0.join(5)
    t1.join(5)
    out = sink.getvalue()
    assert "rank 0 \u00e9\n".encode() in out and b"rank 1 line\n" in out
    assert b"50%\r100%\n" in out and sorted(out) == sorted(
        "rank 0 \u00e9\nrank 1 line\n50%\r100%\nprompt> ".encode())
    assert all(not w or w.endswith((b"\n", b"\r")) or w == b"prompt> " for w in sink.writes)
    assert [(rank, line) for rank, line, *_ in seen] == [
        (1, "rank 1 line"), (0, "rank 0 \u00e9"), (0, "50%\r100%"), (0, "prompt> ")]
