"""Hangs and waits: collectives in flight too long, who never joined and why (`hang`),
waits that are not plain hangs (`waits`), whether a rank others wait for makes progress
(`progress`, with its stack read back by `stackframes`), a slow rank the job's own
timeout ended (`slow_past_timeout`), groups created in a rank-dependent order
(`group_order`, over what each rank created: `creations`), and a group named by its members
that its members name apart (`member_names`) or that a member never calls (`member_skipped`),
a group every rank makes that a counter of every creation names apart (`counter_names`),
and ranks held inside group creation (`creation_waits`: new_group's store barrier, cycles of
creations, a rank computing while the others wait in one).

Layer: detectors (tests/test_layers.py), part of distdoctor.diagnosis: May import the
rendezvous, where the ranks parted (diagnosis/parting) and what the diagnosis package may
import.
"""
