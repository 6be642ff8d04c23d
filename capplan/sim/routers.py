"""Router policies: one name per policy for every input (`simulate --router`, the P/D
`--prefill-router/--decode-router`, plan files, the Python API), the others accepted as
aliases and printed and serialised as the canonical name.

- `round-robin`: a counter over the workers in the order requests reach the router;
- `random`: a seeded uniform draw per request (the P/D replay);
- `least-outstanding`: the worker with the fewest requests in flight (alias `least_loaded`);
- `prefix-affinity`: a request sharing content with an earlier one goes where that one went
  (the fleet replay).
Each replay takes the policies it implements (capplan.sim.fleet.ROUTERS,
capplan.sim.pd.ROUTERS); `canonical_router` refuses the others in one line.
"""

from __future__ import annotations

from collections.abc import Sequence

from capplan.errors import InputError

POLICIES = ("round-robin", "random", "least-outstanding", "prefix-affinity")
ALIASES = {"least-loaded": "least-outstanding", "roundrobin": "round-robin"}
"""Other spellings of a policy (after `_` -> `-`): least_loaded is the fewest requests in
flight, as least-outstanding is."""


def canonical_router(name: object, allowed: Sequence[str] = POLICIES,
                     what: str = "router") -> str:
    """The canonical name of router `name` (any case, `_` or `-`, ALIASES), one of `allowed`;
    InputError naming the choices otherwise."""
    key = str(name).strip().lower().replace("_", "-")
    key = ALIASES.get(key, key)
    if key not in allowed:
        raise InputError(f"{what} {name!r}: expected one of {', '.join(allowed)}")
    return key
