"""A shaped network on one machine: one Linux network namespace per rank, joined by a bridge.

Each rank gets namespace ``m4r<run>-<rank>`` with a veth pair to bridge ``m4r<run>br`` in the
root namespace and address ``10.77.<k // 250>.<k % 250 + 1>``. Host links of the topology are
shaped with ``tc``: on the rank's side (uplink) one HTB class per first-hop cable of its paths,
on the bridge side (downlink) one per last-hop cable, each at the cable's (scaled) rate with a
netem leaf adding its (scaled) latency, and u32 filters sending each peer's traffic to its
class. A gray failure is simply the degraded cable's lower rate. Switch-internal links (rail,
spine) are not shaped: contention appears at host links only (where gray failures of GPUs are).

Everything is named after ``run`` and torn down by :meth:`NamespaceNetwork.close` (also on
errors inside ``with``); :func:`cleanup` removes leftovers of any crashed run. Needs root and
``ip``/``tc`` (iproute2).
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
from dataclasses import dataclass, field

from m4ray.errors import InputError
from m4ray.sim.routing import Routing
from m4ray.sim.topology import Topology

PREFIX = "m4r"
MIN_RATE_BPS = 100e3  # below this tc/HTB timing is too coarse to mean anything
MAX_RATE_BPS = 20e9  # above this one machine cannot carry it; scale down
CLONE_NEWNET = 0x40000000


class NetnsError(RuntimeError):
    """A namespace, interface or qdisc could not be created."""


def available() -> str | None:
    """None when namespaces can be used here, else the reason."""
    if os.geteuid() != 0:
        return "not root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    probe = f"{PREFIX}probe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
    except NetnsError as err:
        return str(err)
    return None


def _run(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise NetnsError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def _ip(*args: str, ns: str | None = None) -> str:
    return _run("ip", *(("-n", ns) if ns else ()), *args)


def _tc(*args: str, ns: str | None = None) -> str:
    return _run(*(("ip", "netns", "exec", ns) if ns else ()), "tc", *args)


@functools.cache
def netem() -> bool:
    """Whether this kernel has the netem qdisc (link latency); without it links are rate-shaped
    only (latencies of µs, scaled, are small next to the ms transfer times we emulate)."""
    if shutil.which("tc") is None or os.geteuid() != 0:
        return False
    probe = f"{PREFIX}netem{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except NetnsError:
        return False
    try:
        _tc("qdisc", "add", "dev", "lo", "root", "netem", "delay", "1us", ns=probe)
        return True
    except NetnsError:
        return False
    finally:
        _ip("netns", "del", probe)


def address(rank: int) -> str:
    return f"10.77.{rank // 250}.{rank % 250 + 1}"


def enter(namespace: str) -> None:
    """Move the calling thread into ``namespace`` (threads it starts afterwards follow)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(f"/var/run/netns/{namespace}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise NetnsError(f"setns({namespace}): {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class Shape:
    """One HTB class: a cable's scaled rate and latency, and the peers whose traffic uses it."""

    rate_bps: float
    delay_s: float
    peers: tuple[int, ...]


def plan(
    topo: Topology, routing: Routing, n_ranks: int, rate_scale: float, time_scale: float
) -> tuple[list[list[Shape]], list[list[Shape]]]:
    """Per rank, its uplink and downlink classes. Checks every rate before anything is made."""
    hosts = topo.hosts
    if n_ranks > len(hosts):
        raise InputError(f"{n_ranks} ranks but the topology has {len(hosts)} hosts")
    if n_ranks > 250 * 250:
        raise InputError(f"{n_ranks} ranks: at most 62500 namespaces")
    up: list[dict[int, list[int]]] = [{} for _ in range(n_ranks)]
    down: list[dict[int, list[int]]] = [{} for _ in range(n_ranks)]
    for a in range(n_ranks):
        for b in range(n_ranks):
            if a != b:
                path = routing.path(hosts[a], hosts[b]).links
                up[a].setdefault(path[0], []).append(b)
                down[b].setdefault(path[-1], []).append(a)

    def shapes(groups: dict[int, list[int]]) -> list[Shape]:
        out = []
        for link, peers in sorted(groups.items()):
            rate = float(topo.bandwidth_bps[link]) * rate_scale
            if not MIN_RATE_BPS <= rate <= MAX_RATE_BPS:
                raise InputError(
                    f"link {link} ({topo.bandwidth_bps[link] / 1e9:g} Gbps) scaled by "
                    f"{rate_scale:g} is {rate / 1e6:g} Mbps; tc shapes {MIN_RATE_BPS / 1e6:g} to "
                    f"{MAX_RATE_BPS / 1e6:g} Mbps here: change emulation.rate_scale",
                    field="emulation.rate_scale",
                )
            out.append(Shape(rate, float(topo.latency_s[link]) * time_scale, tuple(peers)))
        return out

    return [shapes(g) for g in up], [shapes(g) for g in down]


@dataclass(slots=True)
class NamespaceNetwork:
    """Namespaces, veths, a bridge and qdiscs for ``n_ranks`` ranks (a context manager)."""

    run: str
    uplinks: list[list[Shape]]
    downlinks: list[list[Shape]]
    created: list[tuple[str, str]] = field(default_factory=list)

    @property
    def n_ranks(self) -> int:
        return len(self.uplinks)

    def namespace(self, rank: int) -> str:
        return f"{PREFIX}{self.run}-{rank}"

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.run}br"

    def _veth(self, rank: int, side: str) -> str:
        return f"{PREFIX}{self.run}{side}{rank}"[:15]

    def __enter__(self) -> NamespaceNetwork:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        if len(f"{PREFIX}{self.run}h{self.n_ranks}") > 15:
            raise InputError(f"run name {self.run!r} too long for interface names", field="run")
        _ip("link", "add", self.bridge, "type", "bridge")
        self.created.append(("bridge", self.bridge))
        _ip("link", "set", self.bridge, "up")
        for rank in range(self.n_ranks):
            ns, host, inner = self.namespace(rank), self._veth(rank, "h"), self._veth(rank, "n")
            _ip("netns", "add", ns)
            self.created.append(("netns", ns))
            _ip("link", "add", host, "type", "veth", "peer", "name", inner)
            self.created.append(("link", host))
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", host, "master", self.bridge)
            _ip("link", "set", host, "up")
            _ip("addr", "add", f"{address(rank)}/16", "dev", inner, ns=ns)
            _ip("link", "set", inner, "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
            self._shape(inner, self.uplinks[rank], "dst", ns)
            self._shape(host, self.downlinks[rank], "src", None)

    @staticmethod
    def _shape(dev: str, shapes: list[Shape], match: str, ns: str | None) -> None:
        _tc("qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "999", ns=ns)
        _tc(
            "class",
            "add",
            "dev",
            dev,
            "parent",
            "1:",
            "classid",
            "1:999",
            "htb",
            "rate",
            "10gbit",
            ns=ns,
        )  # fmt: skip  (ARP and anything unmatched)
        for index, shape in enumerate(shapes, start=1):
            rate = f"{max(1, round(shape.rate_bps))}bit"
            _tc("class", "add", "dev", dev, "parent", "1:", "classid", f"1:{index}", "htb",
                "rate", rate, "ceil", rate, ns=ns)  # fmt: skip
            if netem():
                delay = f"{max(0, round(shape.delay_s * 1e6))}us"
                _tc("qdisc", "add", "dev", dev, "parent", f"1:{index}", "handle",
                    f"{index + 1}:", "netem", "delay", delay, "limit", "100000",
                    ns=ns)  # fmt: skip
            for peer in shape.peers:
                _tc("filter", "add", "dev", dev, "protocol", "ip", "parent", "1:", "prio", "1",
                    "u32", "match", "ip", match, f"{address(peer)}/32", "flowid", f"1:{index}",
                    ns=ns)  # fmt: skip

    def close(self) -> None:
        """Remove everything this network made (namespaces take their veths with them)."""
        for kind, name in reversed(self.created):
            try:
                if kind == "netns":
                    _ip("netns", "del", name)
                else:
                    _ip("link", "del", name)
            except NetnsError:
                pass  # already gone (a veth disappears with its peer's namespace)
        self.created.clear()


def leftovers(run: str | None = None) -> list[str]:
    """Namespaces and interfaces of ``run`` (or of any m4ray run) that still exist."""
    stem = f"{PREFIX}{run}" if run else PREFIX
    names = [n.split()[0] for n in _ip("netns", "list").splitlines() if n.startswith(stem)]
    for line in _ip("-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(stem):
            names.append(name)
    return names


def cleanup(run: str | None = None) -> list[str]:
    """Remove leftovers of crashed runs; returns what was removed."""
    removed = []
    for name in leftovers(run):
        for cmd in (("netns", "del", name), ("link", "del", name)):
            try:
                _ip(*cmd)
                removed.append(name)
                break
            except NetnsError:
                continue
    return removed


__all__ = ["NamespaceNetwork", "NetnsError", "Shape", "address", "available", "cleanup",
           "enter", "leftovers", "plan"]  # fmt: skip
