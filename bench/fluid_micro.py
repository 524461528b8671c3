"""The fluid DCTCP against real ns-3 on small cases whose answer can be read by hand: each case a
few flows on one switch (an NVSwitch for the ring; two ToRs and a spine for the rail uplink),
with the gray-failure sweep's own network
(`+experiment=gray_failure`: the study's DCTCP, RED, window and 1,000 B packets), started
together or at set times (open loop). Per case, each backend's mean and largest FCT (µs) and
its worst flow's |FCT / ns-3's − 1|; then the mean of that over the cases.

    .venv/bin/python bench/fluid_micro.py                  # ~10 s, ns-3 included
    .venv/bin/python bench/fluid_micro.py --cases ring degraded_port
    .venv/bin/python bench/fluid_micro.py --cc dcqcn          # or hpcc, timely

What each case isolates:

* ``ring``: five GPUs on an NVSwitch (400 Gbit/s), four 512 KiB chunks from each to the next.
  No marks; every link carries one neighbour's data and the other's ACKs (the ACK load).
* ``degraded_port``: a healthy 400 Gbit/s sender into a degraded 100 Gbit/s receiver (2 MiB),
  the study's healthy-to-degraded chunk: the queue at the receiver's port, its marks and the
  window that holds it (fixed against VAR_WIN's rate-scaled window).
* ``two_into_degraded``, ``four_chunks_into_degraded``: the same port with two senders, or four
  chunks from one sender (its NIC shares them).
* ``both_ways``: the degraded port in both directions at once (data and ACKs on each link).
* ``degraded_and_healthy_into_one``: a degraded sender and two healthy ones into a healthy port
  (the degraded sender cut on marks the healthy ones make).
* ``paced_chunks``: eight 128 KiB chunks 20 µs apart into the degraded port (no overlap).
* ``chunk_stream_into_degraded``: thirty 512 KiB chunks 14 µs apart into the degraded port, as
  a ring's steps queue up at its slow hop at the study's scale 0.25 (each step's chunk starts
  when its parent arrives, not when the last chunk on this hop has finished): every new chunk
  starts at line rate with α = 1 while the older ones have been cut, so under VAR_WIN ns-3
  finishes the first ones last; a window held at the full BDP lets them go in order.
* ``rail_uplink_both_ways``: a rail ToR's 400 Gbit/s uplink shared by two degraded senders'
  2 MiB chunks (to healthy GPUs) and two healthy senders' (to degraded GPUs), as in the
  study's first ring steps: the healthy senders' first windows leave at line rate, the
  uplink's queue passes K and marks the degraded senders too, which ns-3 then holds ~30 %
  past their NIC's time. With its first windows held the fluid caps a window by the queues at
  once (its round trip now, not as the ACKs report it a round trip later), so the uplink's
  queue never gets there; with them unheld (the default) it marks them, and over-cuts (22 %).

* ``three_from_a_degraded_nic``: the degraded GPU sends three 2 MiB chunks to healthy ones,
  joining 20 µs apart: its own 100 Gbit/s NIC is their bottleneck, and (under HPCC) no switch
  hop reports it, since a NIC stamps no telemetry (the fluid counted it as a hop before
  2026-12-07, later, and cut these flows toward η of it each window).

These say whether each mechanism is modelled as ns-3 runs it; they do not say how the
mechanisms compose in a closed-loop collective (docs/gray_failure_study.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

GBPS = 1e9
MIB = 1024 * 1024


def cases() -> dict:
    """name -> (topology, flows as (src, dst, bytes, start_s))."""
    from m4ray.sim.topology import Cable, Topology

    gpus = 5
    nvswitch = Topology(
        n_nodes=gpus + 1,
        switches=(gpus,),
        nvswitches=(gpus,),
        cables=tuple(Cable(h, gpus, 400 * GBPS, 5e-8) for h in range(gpus)),
    )
    # hosts 0, 2, 3 healthy (400 Gbit/s), host 1 degraded (100 Gbit/s), one switch (node 4)
    rates = (400, 100, 400, 400)
    tor = Topology(
        n_nodes=5,
        switches=(4,),
        cables=tuple(Cable(h, 4, r * GBPS, 1e-6) for h, r in enumerate(rates)),
    )
    # the study's rail uplink: two degraded and two healthy senders on one ToR (node 8) share
    # its 400 Gbit/s uplink through a spine (10) to another ToR (9); the degraded senders'
    # chunks go to healthy GPUs, the healthy senders' to degraded (100 Gbit/s) ones
    g = GBPS
    rail = Topology(
        n_nodes=11,
        switches=(8, 9, 10),
        cables=(
            *(Cable(h, 8, r * g, 1e-6) for h, r in enumerate((100, 400, 100, 400))),
            *(Cable(h + 4, 9, r * g, 1e-6) for h, r in enumerate((400, 100, 400, 100))),
            Cable(8, 10, 400 * g, 1e-6),
            Cable(10, 9, 400 * g, 1e-6),
        ),
    )
    crossing = [(0, 4), (1, 5), (2, 6), (3, 7)]
    return {
        "ring": (
            nvswitch,
            [(g, (g + 1) % gpus, MIB // 2, 0.0) for g in range(gpus) for _ in "abcd"],
        ),
        "degraded_port": (tor, [(0, 1, 2 * MIB, 0.0)]),
        "two_into_degraded": (tor, [(0, 1, 2 * MIB, 0.0), (2, 1, 2 * MIB, 0.0)]),
        "four_chunks_into_degraded": (tor, [(0, 1, 2 * MIB, 0.0)] * 4),
        "both_ways": (tor, [(0, 1, 2 * MIB, 0.0), (1, 0, 2 * MIB, 0.0)]),
        "degraded_and_healthy_into_one": (
            tor,
            [(1, 0, 2 * MIB, 0.0), (2, 0, 2 * MIB, 0.0), (3, 0, 2 * MIB, 0.0)],
        ),
        "paced_chunks": (tor, [(0, 1, 128 * 1024, i * 20e-6) for i in range(8)]),
        "chunk_stream_into_degraded": (tor, [(0, 1, MIB // 2, i * 14e-6) for i in range(30)]),
        "rail_uplink_both_ways": (rail, [(s, d, 2 * MIB, 0.0) for s, d in crossing]),
        "three_from_a_degraded_nic": (
            tor,
            [(1, 0, 2 * MIB, 0.0), (1, 2, 2 * MIB, 20e-6), (1, 3, 2 * MIB, 40e-6)],
        ),
    }


def backends(cc: str = "dctcp") -> tuple[dict, object]:
    """The sweep's ns-3, the fluid (its defaults; as it was before 2026-12-07, evening: marks
    back a round trip late, every hop seeing the senders' rates, first windows held; and the
    defaults with one rule changed: the window held at the network's, no tandem hops, marks
    back a round trip late, first windows held, no ACK load) and flowSim, as
    ``+experiment=gray_failure wire=default`` composes them; with ``cc`` other than DCTCP, the
    same network running that CC with its reference parameters (ns-3 and the fluid alike)."""
    from composed import resolved

    cfg = resolved("+experiment=gray_failure", "wire=default")
    options = cfg.backend_options
    network = options["ns3"]
    if cc != "dctcp":  # the study's RED points are DCTCP's; the other CCs bring their own
        rdma = dataclasses.replace(network.rdma, cc=cc, ecn_k_max_bytes=None)
        network = dataclasses.replace(network, rdma=rdma)
    fluid = dataclasses.replace(options["fluid_dctcp"], network=network)
    before = dataclasses.replace(fluid, first_window=False, mark_delay="rtt", tandem=False)
    return {
        "ns3": network,
        "fluid_dctcp": fluid,
        "fluid before 2026-12-07": before,
        "fluid held window": dataclasses.replace(fluid, var_window=False),
        "fluid without tandem": dataclasses.replace(fluid, tandem=False),
        "fluid marks back a round trip": dataclasses.replace(fluid, mark_delay="rtt"),
        "fluid no first window": dataclasses.replace(fluid, first_window=False),
        "fluid no ACK load": dataclasses.replace(fluid, ack_load=False),
        "flowsim": options["flowsim"],
    }, cfg.wire


def main() -> None:
    from m4ray.sim.flows import Flow
    from m4ray.sim.fluidcc import CCS
    from m4ray.sim.routing import Routing
    from m4ray.sim.trace import run_trace
    from m4ray.sweeps.report import format_table

    table = cases()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="*", choices=sorted(table), default=list(table))
    parser.add_argument(
        "--cc", choices=["dctcp", *CCS], default="dctcp",
        help="the congestion control ns-3 and the fluid run (default: the study's DCTCP)",
    )  # fmt: skip
    args = parser.parse_args()
    configs, wire = backends(args.cc)
    rows, errors = [], {name: [] for name in configs if name != "ns3"}
    for case in args.cases:
        topo, flows = table[case]
        trace = [Flow(i, *flow) for i, flow in enumerate(flows)]
        fcts = {}
        for name, config in configs.items():
            result = run_trace(topo, trace, config, Routing(topo, wire=wire))
            fcts[name] = result.column("fct_s").to_numpy() * 1e6
        ns3 = fcts["ns3"]
        row = [case, len(ns3), f"{ns3.mean():.1f} / {ns3.max():.1f}"]
        for name, errs in errors.items():
            err = float(np.max(np.abs(fcts[name] / ns3 - 1)))
            errs.append(err)
            row.append(f"{fcts[name].mean():.1f} / {fcts[name].max():.1f} ({100 * err:.1f} %)")
        rows.append(row)
    rows.append(
        ["mean of the worst", "", "", *(f"{100 * np.mean(e):.1f} %" for e in errors.values())]
    )
    headers = ["case", "flows", "ns-3 mean / max µs", *(f"{n} (worst flow)" for n in errors)]
    print(format_table(headers, rows))


if __name__ == "__main__":
    main()
