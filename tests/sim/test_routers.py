"""One name per router policy (capplan/sim/routers.py): every spelling of a policy is accepted
at every input and the canonical one is printed; other names are a one-line error, exit 2."""

from __future__ import annotations

import pytest

from capplan.errors import InputError
from capplan.sim.fleet import ROUTERS as FLEET
from capplan.sim.pd import ROUTERS as PD
from capplan.sim.pd import check_router, route
from capplan.sim.routers import POLICIES, canonical_router


@pytest.mark.parametrize(("given", "want"), [
    ("least_loaded", "least-outstanding"),   # the P/D replay's old spelling
    ("least-loaded", "least-outstanding"),
    ("least_outstanding", "least-outstanding"),
    ("Least-Outstanding", "least-outstanding"),
    ("round_robin", "round-robin"),
    ("prefix_affinity", "prefix-affinity"),
    ("random", "random"),
])
def test_aliases_map_to_one_name(given, want):
    assert canonical_router(given) == want


def test_each_replay_takes_its_policies_under_the_shared_names():
    assert set(FLEET) <= set(POLICIES) and set(PD) <= set(POLICIES)
    assert check_router("least_loaded") == "least-outstanding"
    with pytest.raises(InputError, match="router 'prefix-affinity': expected one of"):
        check_router("prefix-affinity")  # the P/D replay does not implement it
    with pytest.raises(InputError, match="decode router 'fastest'"):
        check_router("fastest", "decode router")


def test_route_reads_either_spelling():
    import numpy as np

    at = np.array([0.0, 0.1, 0.2])
    assert route("round_robin", at, 2).tolist() == route("round-robin", at, 2).tolist()
    assert route("least_loaded", at, 2, done_s=np.array([5.0, 0.15, 5.0])).tolist() == \
        [0, 1, 1]


@pytest.mark.parametrize(("router", "want"), [("least_loaded", "least-outstanding"),
                                              ("round_robin", "round-robin")])
def test_fleet_cli_accepts_the_alias_and_prints_the_name(run_cli, router, want):
    res = run_cli("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "20",
                  "--requests", "40", "--input-len", "200", "--output-len", "16",
                  "--replicas", "2", "--router", router, "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert res.json()["router"] == want


def test_fleet_cli_bad_router_is_one_line(run_cli):
    res = run_cli("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "20",
                  "--requests", "40", "--input-len", "200", "--output-len", "16",
                  "--replicas", "2", "--router", "random")
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        "Error: --router 'random': expected one of round-robin, least-outstanding, "
        "prefix-affinity"]


def test_fleet_api_alias():
    from capplan.plan.fleet_sim import FleetOptions

    assert FleetOptions(replicas=2, router="least_loaded").router == "least-outstanding"
    with pytest.raises(InputError, match="--router 'fastest'"):
        FleetOptions(replicas=2, router="fastest")
