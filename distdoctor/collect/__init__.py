"""Multi-node: a node's forwarder, the collector and the fleet engine.

Each node's `distdoctor run --forward` ships its run dir, or a digest of it, over TCP
(`wire.py`, `forward.py`, `log_source.py`, `digest.py`); the collector (`server.py`, behind `watch
--listen`) keeps a copy of every node's run dir (`mirror.py`) and runs the fleet engine
over the digests (`fleet.py`, `position.py`, `lateness.py`, `links.py`, `lost.py`,
`reports.py`, `bounded.py`), whose findings are the detectors' own. Every number a node
sends is bounded as its frame is read (`peer_numbers.py`; a digest's fields:
`digest_fields.py`). `tls.py`: TLS for the stream and for `/metrics` (DISTDOCTOR_TLS_*),
through Python's `ssl`.

Layer: front ends (tests/test_layers.py). May import the detectors (distdoctor/diagnosis,
distdoctor/findings.py), the probes, the run log and the base modules. The views read the
fleet engine's state when the front end that runs it hands it to them; nothing below this
package imports it.
"""
