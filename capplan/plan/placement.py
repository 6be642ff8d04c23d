"""Where the replicas of a launch block run: their hosts, GPUs and ports. One implementation for
every block that launches several replicas: `recommend`'s aggregated fleet (capplan.plan.flags),
its disaggregated pools (capplan.plan.disagg) and a fixed P/D layout (`latency`, `simulate`, a
plan's `disaggregated_layout`: capplan.plan.launch_multinode.pd_launch).

Replicas fill hosts of the GPU's `host_gpus` in order, pool after pool (`place`): a replica that
does not fit what is left of a host starts the next, one wider than a host takes whole hosts,
pools of different GPUs never share one. One host is `localhost`, several HOST0, HOST1, ...,
and every command of one output names hosts so: a replica over hosts has its k-th host's
name where capplan.plan.launch writes NODEk_IP (`on_hosts`). A replica on one host is pinned
to its GPUs there with CUDA_VISIBLE_DEVICES (`pinned`), as the engines' own examples start
several servers on one host: TensorRT-LLM's examples/disaggregated/README.md
(`CUDA_VISIBLE_DEVICES=0 trtllm-serve ... --port 8001`, one per context and generation
server), SGLang's router README (sgl-project/sglang rust/readme.md, "Launch worker
instances": `export CUDA_VISIBLE_DEVICES=0` before each worker's `python -m
sglang.launch_server`); vLLM reads it through torch like any CUDA program. Each replica takes
its own ports on its host (`host_ports`).

An aggregated fleet of several replicas gets a front end that spreads requests over them
(`replica_front_line`, by EngineProfile.replica_router), round robin: the even split of the
rate each replica was sized for. It listens on the engine's default port (launch.pd_front_port),
where a single replica listens, so clients look in one place whatever the fleet's size.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from capplan.errors import InputError
from capplan.models.engine import engine_profile
from capplan.models.layout import nodes_spanned
from capplan.plan.launch import (
    DISAGG_PORTS,
    DIST_PORT,
    DP_RPC_PORT,
    RAY_PORT,
    REPLICA_PORT,
    LaunchOptions,
    launch_line,
    node_commands,
    node_gpus,
    pd_front_port,
)

MAX_PORT = 65535
LOCALHOST = "localhost"


@dataclass(frozen=True)
class PoolShape:
    """What placing a pool needs: its role, replicas, GPUs per replica, the GPUs of one of its
    hosts, and its GPU (pools of different GPUs never share a host)."""

    role: str
    replicas: int
    gpus: int
    host_gpus: int
    gpu: str = ""


@dataclass(frozen=True)
class Placement:
    """Where one replica runs: its first host's name, its first GPU there, its port."""

    role: str
    host: str
    first_gpu: int
    port: int
    kv_port: int | None = None
    """The port of its KV handshake (`host_ports`, as `port`): vLLM's NIXL side channel, an
    SGLang prefill server's bootstrap; None where the engine or role listens on none."""
    gpus: int = 1
    span: int = 1
    """Hosts it spans (whole hosts when more than one)."""
    host_gpus: int = 8
    per_host: tuple[int, ...] = ()
    """The GPUs each of its hosts runs, as its commands start it (launch.node_gpus); empty:
    every GPU of each."""

    @property
    def hosts(self) -> str:
        """Its host, or its first and last of several (HOST2-HOST3)."""
        if self.span == 1:
            return self.host
        return f"{self.host}-HOST{int(self.host[4:]) + self.span - 1}"

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        """Its GPUs on its host (CUDA_VISIBLE_DEVICES); none for a replica over hosts, which
        takes every GPU of each."""
        return tuple(range(self.first_gpu, self.first_gpu + self.gpus)) if self.span == 1 else ()

    def gpu_text(self) -> str:
        if self.span > 1:
            counts = self.per_host or (self.host_gpus,) * self.span
            if len(set(counts)) == 1:
                return f"GPUs 0-{counts[0] - 1} of each"
            first = int(self.host[4:])
            return "GPUs " + ", ".join(f"0-{n - 1} of HOST{first + k}"
                                       for k, n in enumerate(counts))
        last = self.first_gpu + self.gpus - 1
        return f"GPU {last}" if last == self.first_gpu else f"GPUs {self.first_gpu}-{last}"


def place(engine: str, pools: Sequence[PoolShape], fronts: int = 1) -> list[Placement]:
    """Every replica of `pools` on hosts (see the module docstring), with its ports
    (`host_ports`, `fronts` front ends' ports kept free) for `engine`."""
    slots: list[tuple[PoolShape, int, int]] = []
    host, used, gpu = 0, 0, None
    for pool in pools:
        g, cap = pool.gpus, pool.host_gpus
        for _ in range(pool.replicas):
            if used and (used + g > cap or pool.gpu != gpu):
                host, used = host + 1, 0
            slots.append((pool, host, used))
            gpu, used = pool.gpu, used + g
            if used >= cap:
                host, used = host + -(-used // cap), 0
    return _placements(engine, slots, host + (1 if used else 0), fronts)


def _placements(engine: str, slots: list[tuple[PoolShape, int, int]], count: int,
                fronts: int, busy: dict[str, set[int]] | None = None) -> list[Placement]:
    """The replicas at `slots` (pool, host index, first GPU) on `count` hosts, with their ports
    (`host_ports`; `busy`: ports other fleets take on a host)."""
    def name(i: int) -> str:
        return LOCALHOST if count == 1 else f"HOST{i}"

    ports = host_ports(engine, [(p.role, name(h), p.gpus) for p, h, _ in slots], fronts, busy)
    return [Placement(p.role, name(h), first, port, kv, p.gpus, span, p.host_gpus,
                      tuple(node_gpus(engine, p.gpus, p.host_gpus, span)) if span > 1 else ())
            for (p, h, first), (port, kv) in zip(slots, ports, strict=True)
            for span in [nodes_spanned(p.gpus, p.host_gpus)]]


def host_ports(engine: str, workers: list[tuple[str, str, int]], fronts: int = 1,
               busy: dict[str, set[int]] | None = None) -> list[tuple[int, int | None]]:
    """Each replica's (HTTP port, KV handshake port), the replicas given as (role, host, ranks)
    in launch order. HTTP: from its role's first port up (DISAGG_PORTS; an aggregated
    "replica": REPLICA_PORT), the k-th replica of a role on a host on the k-th port (8100,
    8101, ...). KV handshake (PdServing.kv_handshake; None for a role that listens on none,
    or an engine without one): from the engine's default up, a host's workers apart by the
    ranks of those before it (vLLM's side channel takes one port per rank) or by one (SGLang's
    bootstrap servers). No port is taken twice on a host, nor the `fronts` front ends'
    (`pd_front_port` up, `front_port`) or a rendezvous port (DIST_PORT, DP_RPC_PORT,
    RAY_PORT), nor one `busy` lists for its host: a port already taken moves a replica to the
    next free one (only a host of hundreds of replicas gets there)."""
    spec = engine_profile(engine).pd.kv_handshake
    reserved = {*(front_port(engine, i) for i in range(fronts)), DIST_PORT, DP_RPC_PORT,
                RAY_PORT}
    used: dict[str, set[int]] = {}
    cursor: dict[tuple[str, str], int] = {}
    out: list[tuple[int, int | None]] = []
    for role, host, ranks in workers:
        taken = used.setdefault(host, reserved | (busy or {}).get(host, set()))
        first = DISAGG_PORTS.get(role, REPLICA_PORT)
        http = _free_ports(taken, cursor.get((host, role), first), 1)
        cursor[(host, role)] = http + 1
        kv = None
        if spec is not None and role in spec.roles:
            width = ranks if spec.per_rank else 1
            kv = _free_ports(taken, cursor.get((host, "kv"), spec.port), width)
            cursor[(host, "kv")] = kv + width
        out.append((http, kv))
    return out


def _free_ports(taken: set[int], start: int, width: int) -> int:
    """The first of `width` consecutive ports from `start` none of which is `taken` (which
    they join)."""
    port = start
    while any(p in taken for p in range(port, port + width)):
        port += 1
    if port + width - 1 > MAX_PORT:
        raise InputError(f"the launch lines need ports past {MAX_PORT} on one host: a layout of "
                         "this many workers does not fit one host's ports; give fewer workers")
    taken.update(range(port, port + width))
    return port


def pinned(o: LaunchOptions, at: Placement) -> LaunchOptions:
    """A replica's launch options placed `at`: its port and, on one host, its GPUs."""
    return replace(o, port=at.port, gpu_ids=at.gpu_ids)


_NODE = re.compile(r"\bNODE(\d+)_IP\b")
_HOST = re.compile(r"\bHOST(\d+)\b")


def on_hosts(commands: list[str], at: Placement) -> list[str]:
    """A replica's commands (capplan.plan.launch.node_commands: NODEk_IP its k-th host's
    address) with its hosts' names in the layout (HOST{first + k})."""
    if at.span == 1 or not at.host.startswith("HOST"):
        return commands
    first = int(at.host[4:])
    return [_NODE.sub(lambda m: f"HOST{first + int(m.group(1))}", c) for c in commands]


def one_replica(text: str) -> str:
    """A placed replica's launch text with its hosts as one replica's placeholders (its first
    host HOSTi as NODE0_IP, HOSTi+k as NODEk_IP): the Kubernetes export's input, where each
    pod of a group finds the others by its own means."""
    found = [int(m.group(1)) for m in _HOST.finditer(text)]
    if not found:
        return text
    first = min(found)
    return _HOST.sub(lambda m: f"NODE{int(m.group(1)) - first}_IP", text)


def needs_hosts_line(where: list[Placement]) -> bool:
    """Whether a launch block says where each replica runs: beyond two replicas, or over
    several hosts (two on `localhost` say it in their GPUs and ports)."""
    return len(where) > 2 or where[-1].host != LOCALHOST


def hosts_line(where: list[Placement]) -> str:
    """Which replica runs where: its host (hosts), GPUs, port and KV handshake port."""
    counts: dict[str, int] = {}
    parts = []
    for x in where:
        i = counts[x.role] = counts.get(x.role, -1) + 1
        kv = "" if x.kv_port is None else f", KV handshake port {x.kv_port}"
        parts.append(f"{x.hosts}: {x.role} {i} ({x.gpu_text()}, port {x.port}{kv})")
    return "; ".join(parts)


def labelled(head: str, text: str) -> str:
    """`text` (one command per line) after `head`, its further lines under its first."""
    return head + text.replace("\n", "\n" + " " * len(head))


@dataclass(frozen=True)
class Around:
    """Where fleets printed for comparison go beside the fleets of an output that keep running
    (plan/pool_day.py: one model's comparison, an alternative to its own running fleets only):
    on `own` (its model's running hosts, `kinds` their GPUs) wherever the `taken` (host, GPU)
    and `ports` (host, port) of the others leave room, then on hosts from `after` (past every
    running fleet) up; its router on the `front`-th front port, the running output's `fronts`
    kept free; hosts named as in the running output of `hosts` hosts."""

    own: tuple[int, ...]
    kinds: tuple[tuple[int, str], ...]
    after: int
    taken: frozenset[tuple[int, int]]
    ports: frozenset[tuple[int, int]]
    front: int
    fronts: int
    hosts: int


def place_around(engine: str, pools: Sequence[PoolShape], a: Around) -> list[Placement]:
    """Every replica of `pools` placed as `a` says (Around), in order: each on the first host
    from the last one used that may take its GPU and has room (its GPUs on a host free of
    `a.taken`; one wider than a host: whole free hosts)."""
    busy = set(a.taken)
    kind = dict(a.kinds)
    own = set(a.own)

    def fits(h: int, first: int, g: int, gpu: str) -> bool:
        ok = (h in own or h >= a.after) and kind.get(h, gpu) == gpu
        return ok and not any((h, x) in busy for x in range(first, first + g))

    slots: list[tuple[PoolShape, int, int]] = []
    host = min(own, default=a.after)
    for pool in pools:
        g, cap = pool.gpus, pool.host_gpus
        for _ in range(pool.replicas):
            host, first = _free_slot(fits, host, g, cap, pool.gpu)
            span = -(-g // cap)
            for k in range(span):
                kind[host + k] = pool.gpu
                busy.update((host + k, x) for x in range(first, first + min(g, cap)))
            slots.append((pool, host, first))
    count = max([a.hosts, *(h + -(-p.gpus // p.host_gpus) for p, h, _ in slots)])
    names = {h: LOCALHOST if count == 1 else f"HOST{h}" for h in range(count)}
    taken_ports: dict[str, set[int]] = {}
    for h, port in a.ports:
        taken_ports.setdefault(names.get(h, f"HOST{h}"), set()).add(port)
    return _placements(engine, slots, count, a.fronts, taken_ports)


def _free_slot(fits: Callable[[int, int, int, str], bool], host: int, g: int, cap: int,
               gpu: str) -> tuple[int, int]:
    """The first (host, first GPU) from `host` up where a replica of `g` GPUs fits (`fits`
    over each host it takes: GPUs `first`.. on one host, every GPU of whole hosts)."""
    while True:
        if g > cap:
            if all(fits(host + k, 0, cap, gpu) for k in range(-(-g // cap))):
                return host, 0
        else:
            for first in range(0, cap - g + 1, g):
                if fits(host, first, g, gpu):
                    return host, first
        host += 1


@dataclass(frozen=True)
class Output:
    """The aggregated fleets one output prints side by side (several models' day plans, a plan's
    pool per lane), in order, and which of them a launch block is: they run at once, so they
    are placed as one (`fleet_place`) and no two claim a GPU or a port of one host."""

    pools: tuple[PoolShape, ...]
    index: int = 0
    around: Around | None = None
    """Where they go when printed for comparison beside fleets that run (place_around)."""


def front_port(engine: str, i: int = 0) -> int:
    """The port of the i-th fleet's front end of an output: the engine's default
    (`pd_front_port`) and the next ones up."""
    return pd_front_port(engine) + i


def fleet_place(engine: str, out: Output) -> tuple[list[Placement], int]:
    """Where the replicas of `out`'s fleet run, placed with every other fleet of the output
    (`place`, their pools in order), and its front end's port (`front_port`)."""
    a = out.around
    where = (place(engine, out.pools, fronts=len(out.pools)) if a is None
             else place_around(engine, out.pools, a))
    start = sum(p.replicas for p in out.pools[:out.index])
    front = out.index if a is None else a.front + out.index
    return where[start:start + out.pools[out.index].replicas], front_port(engine, front)


def fleet_text(engine: str, o: LaunchOptions, replicas: int, out: Output | None = None) -> str:
    """An aggregated fleet of `replicas` replicas launched with `o` (one replica's options), as
    the launch block prints it: each replica's commands ("replica i (HOSTS): ..."), pinned to
    its GPUs on its own port, then the front end over them ("router: ...", none for one
    replica) and, where the lines do not say it, which replica runs where ("hosts: ...").
    `out`: its place among the fleets of its output (default: the output's only fleet)."""
    world = o.tp * o.pp * o.attention_dp
    where, front = fleet_place(engine, out or Output(
        (PoolShape("replica", replicas, world, o.gpus_per_node),)))
    rows = []
    for i, at in enumerate(where):
        po = pinned(o, at)
        cmds = on_hosts(node_commands(launch_line(engine, po), po), at)
        rows.append(labelled(f"replica {i} ({at.hosts}): ", "\n".join(cmds)))
    if len(where) > 1:
        rows.append("router: " + replica_front_line(engine, [(x.host, x.port) for x in where],
                                                    front))
    if needs_hosts_line(where):
        rows.append("hosts: " + hosts_line(where))
    return "\n".join(rows)


def fleet_address(engine: str, o: LaunchOptions, replicas: int, out: Output | None = None
                  ) -> tuple[str, int]:
    """The host and port of a fleet's first replica: the engine's default on `localhost` when it
    runs alone, else where `fleet_text` places it (its first host)."""
    if replicas <= 1 and out is None:
        return LOCALHOST, o.port_for(engine)
    world = o.tp * o.pp * o.attention_dp
    at = fleet_place(engine, out or Output(
        (PoolShape("replica", replicas, world, o.gpus_per_node),)))[0][0]
    return at.host, at.port


VLLM_ROUTER_INSTALL = "pip install vllm-router"
"""Where vLLM's router comes from: the vllm-project/router package on PyPI (the NIXL proxy of
vLLM's tests, toy_proxy_server.py, ships only in a source checkout)."""


def router_urls(workers: list[tuple[str, int]], flag: str = "") -> str:
    """The workers at (host, port) as a router lists them, each after `flag` when given."""
    return " ".join(f"{flag} http://{h}:{q}" if flag else f"http://{h}:{q}" for h, q in workers)


def sglang_router(args: str, port: int, tail: str = "") -> str:
    """SGLang's router with `args` (its workers: aggregated `--worker-urls`, or
    `--pd-disaggregation` with --prefill / --decode URLs), listening on `port`, then `tail`
    (sgl-router py_src/sglang_router/router_args.py: --worker-urls takes the worker URLs,
    nargs="*"; --policy random|round_robin|cache_aware|power_of_two, default cache_aware;
    --host default 127.0.0.1, --port default 30000)."""
    return f"python -m sglang_router.launch_router {args} --host 0.0.0.0 --port {port}{tail}"


def vllm_router(args: str, port: int, tail: str = "") -> str:
    """vLLM's router with `args` (aggregated `--worker-urls URL...`, or
    `--vllm-pd-disaggregation` with --prefill / --decode URLs), listening on `port`, then
    `tail` and where it comes from (vllm-project/router src/main.rs: regular mode
    `--worker-urls`, num_args 0..; --policy round_robin among random|round_robin|cache_aware|
    power_of_two|..., default cache_aware; --host default 127.0.0.1, --port default 30000)."""
    return f"vllm-router {args} --host 0.0.0.0 --port {port}{tail}  # {VLLM_ROUTER_INSTALL}"


REPLICA_FRONT_LINES: dict[str, Callable[[str, int], str]] = {
    "sglang-router": sglang_router, "vllm-router": vllm_router}
"""The router of each aggregated front end (EngineProfile.replica_router)."""


def replica_front_line(engine: str, workers: list[tuple[str, int]], port: int | None = None
                       ) -> str:
    """The router in front of an aggregated fleet's replicas, each at (host, port), every one
    listed, round robin, on `port` (default: the engine's, `pd_front_port`)."""
    build = REPLICA_FRONT_LINES[engine_profile(engine).replica_router]
    return build(f"--worker-urls {router_urls(workers)} --policy round_robin",
                 pd_front_port(engine) if port is None else port)
