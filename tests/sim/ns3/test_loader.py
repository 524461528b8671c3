"""The partial ns-3 loader against the real wheel: a lone TCP flow is delivered.

Runs in a subprocess: an ns-3 assertion would kill the interpreter, and cppyy's ~300 MB should
not stay in the test process.
"""

from __future__ import annotations

import subprocess

from tests.conftest import PYTHON, REPO

SCRIPT = """
from m4ray.sim.ns3.loader import load
ns = load()
assert load() is ns
nodes = ns.NodeContainer(); nodes.Create(3)
ns.InternetStackHelper().Install(nodes)
p2p = ns.PointToPointHelper()
p2p.SetDeviceAttribute("DataRate", ns.StringValue("10Gbps"))
p2p.SetChannelAttribute("Delay", ns.StringValue("1us"))
addr = ns.Ipv4AddressHelper()
ifs = []
for a, b, net in ((0, 2, "10.0.0.0"), (1, 2, "10.0.1.0")):
    addr.SetBase(ns.Ipv4Address(net), ns.Ipv4Mask("255.255.255.252"))
    ifs.append(addr.Assign(p2p.Install(nodes.Get(a), nodes.Get(b))))
ns.Ipv4GlobalRoutingHelper.PopulateRoutingTables()
any_port = ns.InetSocketAddress(ns.Ipv4Address.GetAny(), 9).ConvertTo()
sinks = ns.PacketSinkHelper("ns3::TcpSocketFactory", any_port).Install(nodes.Get(1))
dst = ns.InetSocketAddress(ifs[1].GetAddress(0), 9).ConvertTo()
bulk = ns.BulkSendHelper("ns3::TcpSocketFactory", dst)
bulk.SetAttribute("MaxBytes", ns.UintegerValue(100000))
bulk.Install(nodes.Get(0))
ns.Simulator.Stop(ns.Seconds(0.1))
ns.Simulator.Run()
print("RX", sinks.Get(0).GetTotalRx(), "T", ns.Simulator.Now().GetSeconds())
ns.Simulator.Destroy()
"""


def test_loader_runs_a_real_flow():
    proc = subprocess.run(
        [PYTHON, "-c", SCRIPT], capture_output=True, text=True, cwd=REPO, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RX 100000 " in proc.stdout  # every byte of the flow reached the sink
