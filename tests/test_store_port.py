"""The port `run --nproc` hands a job's store (MASTER_PORT): drawn below the kernel's
ephemeral range, so the connections a busy machine opens meanwhile cannot take it before
rank 0 binds it (a suite run once lost a job to EADDRINUSE at its store that way)."""

import socket

from distdoctor.launch import env


def _ephemeral() -> tuple[int, int]:
    with open(env.EPHEMERAL) as f:
        lo, hi = map(int, f.read().split())
    return lo, hi


def test_a_store_port_is_free_and_outside_the_ephemeral_range():
    lo, hi = _ephemeral()
    ports = {env.free_port() for _ in range(20)}
    assert len(ports) > 1  # drawn, not one fixed port
    for port in ports:
        assert not lo <= port <= hi, (port, lo, hi)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", port))  # free on every address


def test_a_port_held_by_a_listener_is_not_drawn(monkeypatch):
    # every port of a narrow range but one is held: that one is drawn each time
    held = []
    try:
        base = 20_000
        for port in range(base, base + 256):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        free = held.pop(128)
        free_port = free.getsockname()[1]
        free.close()
        monkeypatch.setattr(env, "LOW_PORTS", (base, base + 256))
        monkeypatch.setattr(env, "DRAWS", 20_000)
        assert {env.free_port() for _ in range(3)} == {free_port}
    finally:
        for s in held:
            s.close()


def test_without_room_below_the_range_the_kernel_chooses(tmp_path, monkeypatch):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("1024\t65000\n")
    monkeypatch.setattr(env, "EPHEMERAL", str(ranges))
    port = env.free_port()
    lo, hi = _ephemeral()
    assert lo <= port <= hi  # bind(0)'s port: the machine's real range
