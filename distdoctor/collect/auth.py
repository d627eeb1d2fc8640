"""Who may send to the collector: the token's challenge and response, the throttle on wrong
answers, and the name a client certificate gives a node.

The token never crosses the wire. The collector sends a fresh random nonce (CHALLENGE);
the node answers HMAC-SHA256(token, LABEL || nonce || host) (AUTH). A recording of a whole
session is useless to whoever replays it: the nonce it answered is never asked again. The
host is inside the MAC, so an answer cannot be moved to another node's name. Without TLS a
man in the middle can still change the frames after the answer; TLS (collect/tls.py) is
what keeps them private and whole.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

NONCE_BYTES = 32
LABEL = b"distdoctor-forward-auth-v4\0"  # an answer is good for this protocol only

# Wrong answers from one address: the first few are judged at once, then the address
# waits twice as long after each (0.5 s, 1 s, ... up to LOCKOUT_MAX_S) before its next
# answer is judged; FORGET_S without a wrong answer and it starts afresh. An online
# guesser gets a few dozen guesses an hour instead of a thousand a second.
FREE_WRONG = 2
LOCKOUT_BASE_S = 0.5
LOCKOUT_MAX_S = 60.0
FORGET_S = 600.0
MAX_ADDRESSES = 4096  # remembered; past that the oldest is forgotten (memory bound)
# Over all addresses (a guesser with thousands of them gets FREE_WRONG from each, and the
# table above forgets past MAX_ADDRESSES): at most GLOBAL_BURST wrong answers judged at
# once and GLOBAL_WRONG_PER_S after that. Past it an answer is refused unjudged, but for
# one from an address a node got in from before (the nodes that reconnect), judged as
# ever: a guesser cannot keep them out, and a new node gets in once the guessing stops.
GLOBAL_WRONG_PER_S = 0.5
GLOBAL_BURST = 16


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def answer(token: str, nonce: bytes, host: str) -> str:
    """The node's side: what it sends in AUTH."""
    mac = hmac.new(token.encode(), LABEL + nonce + host.encode(), hashlib.sha256)
    return mac.hexdigest()


def is_right(token: str, nonce: bytes, host: str, given) -> bool:
    """The collector's side, in constant time (nothing learnt from how long it took)."""
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(answer(token, nonce, host).encode(),
                               given.encode(errors="replace"))


class WrongAnswers:
    """Wrong answers per peer address, and how long that address must wait."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        # address -> (wrong answers, last wrong at, may answer again at)
        self._by_address: OrderedDict[str, tuple[int, float, float]] = OrderedDict()
        self._known: OrderedDict[str, None] = OrderedDict()  # a node got in from these
        self._budget = float(GLOBAL_BURST)  # wrong answers that may be judged now
        self._budget_at = clock()

    def may_judge(self, address: str) -> bool:
        """Whether an answer from `address` is judged now (its own wait aside, wait_s):
        always from an address a node got in from before, else while the wrong answers
        over all addresses are within GLOBAL_BURST and GLOBAL_WRONG_PER_S."""
        if address in self._known:
            return True
        now = self._clock()
        self._budget = min(GLOBAL_BURST, self._budget + (now - self._budget_at)
                           * GLOBAL_WRONG_PER_S)
        self._budget_at = now
        return self._budget >= 1.0

    def right(self, address: str) -> None:
        """A node got in from `address`: its answers are judged whatever the others do."""
        self._known[address] = None
        self._known.move_to_end(address)
        while len(self._known) > MAX_ADDRESSES:
            self._known.popitem(last=False)

    def wait_s(self, address: str) -> float:
        """Seconds before an answer from `address` is judged again (0: now)."""
        entry = self._by_address.get(address)
        if entry is None:
            return 0.0
        wrong, last, until = entry
        now = self._clock()
        if now - last > FORGET_S:
            del self._by_address[address]
            return 0.0
        return max(0.0, until - now)

    def wrong(self, address: str) -> None:
        now = self._clock()
        count = 0
        if address in self._by_address:
            count, last, _ = self._by_address.pop(address)
            if now - last > FORGET_S:
                count = 0
        count += 1
        over = count - FREE_WRONG
        wait = 0.0 if over <= 0 else min(LOCKOUT_MAX_S, LOCKOUT_BASE_S * 2 ** (over - 1))
        self._by_address[address] = (count, now, now + wait)
        while len(self._by_address) > MAX_ADDRESSES:
            self._by_address.popitem(last=False)
        self.may_judge("")  # (the budget brought up to now, then one less)
        self._budget = max(0.0, self._budget - 1.0)


# --- a client certificate's names (mTLS) --------------------------------------------------

def certificate_names(peercert: dict | None) -> list[str]:
    """The DNS names of a verified client certificate (ssl's getpeercert() form): its
    subjectAltName DNS entries and its subject's commonName."""
    if not peercert:
        return []
    names = [value for kind, value in peercert.get("subjectAltName", ()) if kind == "DNS"]
    for rdn in peercert.get("subject", ()):
        names += [value for key, value in rdn if key == "commonName"]
    return [n for n in names if isinstance(n, str) and n]


def canonical_host(host: str) -> str:
    """The one spelling of a host name a certificate vouches for: DNS names are the same
    whatever their case and a final dot, so `NODE7` and `node7.` are node7 (else one
    certificate's holder was as many nodes as it had spellings, each its own host)."""
    return host.lower().rstrip(".") or host


def host_matches(host: str, names: list[str]) -> bool:
    """Whether a node that says it is `host` may be the holder of a certificate naming
    `names`: the same name (case aside), a wildcard's one label (`*.nodes.example`), or
    the short form of a full name (`node7` for `node7.nodes.example`: gethostname() is
    often the short one)."""
    host = canonical_host(host)
    for name in (canonical_host(n) for n in names):
        if name == host or name.split(".", 1)[0] == host and "*" not in name:
            return True
        if name.startswith("*.") and "." in host:
            label, rest = host.split(".", 1)
            if label and rest == name[2:]:
                return True
    return False
