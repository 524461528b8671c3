"""The C++ half of the ns-3 backend, compiled at run time by cppyy (once per process).

Everything that runs per packet lives here; Python is called once per flow completion and once per
scheduled callback, never per packet (``reference/ns3.md`` §6):

* ``m4ray::FlowRouting`` — an ``Ipv4RoutingProtocol`` consulted before static/global routing. It
  forwards by a per-flow table keyed by the receiver's address and the flow's sink port (data
  packets carry them as destination, ACKs as source), filled from m4ray's own ``Routing``, so
  ns-3 and every other backend use exactly the same paths (per-flow ECMP, hosts never forward).
  Packets without a flow entry (TCP's connect-time route lookup) use a per-destination table.
* ``m4ray::Network`` (a ``m4ray::Fabric``, ``fabric.py``: Python hooks, wall-clock guard,
  recording) — builds nodes, links (p2p device + 1-packet NIC queue + RED/ECN queue disc),
  addresses and routers; starts flows (PacketSink + BulkSend created at the moment they start);
  counts received bytes and reports ``(flow_id, t)`` when the last byte arrives. A link's
  recorded backlog is its queue disc + NIC queue.
"""

from __future__ import annotations

from m4ray.sim.ns3 import fabric

SOURCE = r"""
#include <algorithm>
#include <cstring>
#include <functional>
#include <unordered_map>
#include <vector>

namespace m4ray {
using namespace ns3;

struct Hop {
    uint32_t iface;
    Ipv4Address gateway;
};

class FlowRouting : public Ipv4RoutingProtocol {
  public:
    static TypeId GetTypeId() {
        static TypeId tid = TypeId("m4ray::FlowRouting")
                                .SetParent<Ipv4RoutingProtocol>()
                                .SetGroupName("Internet")
                                .AddConstructor<FlowRouting>();
        return tid;
    }
    void SetIpv4(Ptr<Ipv4> ipv4) override { m_ipv4 = ipv4; }
    void NotifyInterfaceUp(uint32_t) override {}
    void NotifyInterfaceDown(uint32_t) override {}
    void NotifyAddAddress(uint32_t, Ipv4InterfaceAddress) override {}
    void NotifyRemoveAddress(uint32_t, Ipv4InterfaceAddress) override {}
    void PrintRoutingTable(Ptr<OutputStreamWrapper>, Time::Unit) const override {}

    void AddDestination(Ipv4Address dst, Hop hop) { m_dst[dst.Get()] = hop; }
    // a flow is (receiver address, sink port): data packets carry them as destination address
    // and port, ACKs as source address and port
    void AddFlow(Ipv4Address receiver, uint16_t port, bool reverse, Hop hop) {
        (reverse ? m_rev : m_fwd)[Key(receiver, port)] = hop;
    }

    Ptr<Ipv4Route> RouteOutput(Ptr<Packet> p, const Ipv4Header& header, Ptr<NetDevice>,
                               Socket::SocketErrno& err) override {
        const Hop* hop = Lookup(p, header);
        if (hop == nullptr) {
            err = Socket::ERROR_NOROUTETOHOST;
            return nullptr;
        }
        err = Socket::ERROR_NOTERROR;
        return MakeRoute(header.GetDestination(), *hop);
    }

    bool RouteInput(Ptr<const Packet> p, const Ipv4Header& header, Ptr<const NetDevice> idev,
                    const UnicastForwardCallback& ucb, const MulticastForwardCallback&,
                    const LocalDeliverCallback& lcb, const ErrorCallback&) override {
        uint32_t iif = m_ipv4->GetInterfaceForDevice(idev);
        if (m_ipv4->IsDestinationAddress(header.GetDestination(), iif)) {
            if (lcb.IsNull()) return false;
            lcb(p, header, iif);
            return true;
        }
        const Hop* hop = Lookup(p, header);
        if (hop == nullptr) return false;
        ucb(MakeRoute(header.GetDestination(), *hop), p, header);
        return true;
    }

  private:
    const Hop* Lookup(Ptr<const Packet> p, const Ipv4Header& header) const {
        if (p && header.GetProtocol() == 6 && p->GetSize() >= 4) {
            uint8_t buf[4];
            p->CopyData(buf, 4);
            uint16_t sport = (buf[0] << 8) | buf[1];
            uint16_t dport = (buf[2] << 8) | buf[3];
            auto f = m_fwd.find(Key(header.GetDestination(), dport));
            if (f != m_fwd.end()) return &f->second;
            auto r = m_rev.find(Key(header.GetSource(), sport));
            if (r != m_rev.end()) return &r->second;
        }
        auto d = m_dst.find(header.GetDestination().Get());
        return d == m_dst.end() ? nullptr : &d->second;
    }
    static uint64_t Key(Ipv4Address addr, uint16_t port) {
        return (uint64_t(addr.Get()) << 16) | port;
    }
    Ptr<Ipv4Route> MakeRoute(Ipv4Address dst, const Hop& hop) const {
        Ptr<Ipv4Route> route = Create<Ipv4Route>();
        route->SetDestination(dst);
        route->SetSource(m_ipv4->GetAddress(hop.iface, 0).GetLocal());
        route->SetGateway(hop.gateway);
        route->SetOutputDevice(m_ipv4->GetNetDevice(hop.iface));
        return route;
    }
    Ptr<Ipv4> m_ipv4;
    std::unordered_map<uint32_t, Hop> m_dst;
    std::unordered_map<uint64_t, Hop> m_fwd, m_rev;
};

struct LinkEnd {  // one directed link: sending node, its interface, receiver's address
    uint32_t node;
    uint32_t iface;
    Ipv4Address peer;
    Ptr<PointToPointNetDevice> device;
    Ptr<QueueDisc> qdisc;
};

class Network : public Fabric {
  public:
    explicit Network(uint32_t n_nodes) {
        m_nodes.Create(n_nodes);
        InternetStackHelper().Install(m_nodes);
        m_routers.resize(n_nodes);
        for (uint32_t i = 0; i < n_nodes; ++i) {
            Ptr<Ipv4> ipv4 = m_nodes.Get(i)->GetObject<Ipv4>();
            Ptr<Ipv4ListRouting> list = DynamicCast<Ipv4ListRouting>(ipv4->GetRoutingProtocol());
            m_routers[i] = CreateObject<FlowRouting>();
            list->AddRoutingProtocol(m_routers[i], 100);
        }
        m_addresses.SetBase("10.0.0.0", "255.255.255.252");
    }

    // A full-duplex link a<->b; returns nothing, links are numbered 2*i (a->b), 2*i+1 (b->a).
    void AddLink(uint32_t a, uint32_t b, double rate_bps, int64_t delay_ps, uint32_t mtu,
                 uint32_t red_k_packets, uint32_t buffer_packets, double error_rate) {
        PointToPointHelper p2p;
        p2p.SetDeviceAttribute("DataRate", DataRateValue(DataRate(uint64_t(rate_bps))));
        p2p.SetDeviceAttribute("Mtu", UintegerValue(mtu));
        p2p.SetChannelAttribute("Delay", TimeValue(PicoSeconds(delay_ps)));
        p2p.SetQueue("ns3::DropTailQueue<Packet>", "MaxSize", StringValue("1p"));
        NetDeviceContainer devs = p2p.Install(m_nodes.Get(a), m_nodes.Get(b));
        TrafficControlHelper tch;
        tch.SetRootQueueDisc("ns3::RedQueueDisc",
            "MinTh", DoubleValue(red_k_packets), "MaxTh", DoubleValue(red_k_packets),
            "MaxSize", QueueSizeValue(QueueSize(QueueSizeUnit::PACKETS, buffer_packets)),
            "MeanPktSize", UintegerValue(mtu),
            "LinkBandwidth", DataRateValue(DataRate(uint64_t(rate_bps))),
            "LinkDelay", TimeValue(PicoSeconds(delay_ps)));
        QueueDiscContainer qdiscs = tch.Install(devs);  // before addresses, or Assign adds FqCoDel
        Ipv4InterfaceContainer ifs = m_addresses.Assign(devs);
        m_addresses.NewNetwork();
        for (int side = 0; side < 2; ++side) {
            Ptr<Ipv4> ipv4 = ifs.Get(side).first;
            LinkEnd end{side == 0 ? a : b, ifs.Get(side).second, ifs.GetAddress(1 - side),
                        DynamicCast<PointToPointNetDevice>(devs.Get(side)), qdiscs.Get(side)};
            m_links.push_back(end);
            m_local.push_back(ifs.GetAddress(side));  // address of the sender on this link
        }
        if (error_rate > 0) {
            for (int side = 0; side < 2; ++side) SetLoss(m_links.size() - 2 + side, error_rate);
        }
    }

    void SetRate(uint32_t link, double rate_bps) {
        m_links[link].device->SetDataRate(DataRate(uint64_t(rate_bps)));
    }
    // packets arriving over `link` are lost with probability `rate` (receiver-side error model)
    void SetLoss(uint32_t link, double rate) {
        Ptr<RateErrorModel> em = CreateObject<RateErrorModel>();
        em->SetAttribute("ErrorUnit", StringValue("ERROR_UNIT_PACKET"));
        em->SetAttribute("ErrorRate", DoubleValue(rate));
        em->AssignStreams(1000 + link);
        m_links[link ^ 1u].device->SetReceiveErrorModel(em);
    }

    // Route flow `port` over directed links `path` (src->dst) and ACKs over `back` (dst->src).
    void Route(uint16_t port, const std::vector<uint32_t>& path,
               const std::vector<uint32_t>& back) {
        Ipv4Address receiver = m_links[path.back()].peer;
        for (uint32_t l : path) {
            m_routers[m_links[l].node]->AddFlow(receiver, port, false,
                                                {m_links[l].iface, m_links[l].peer});
        }
        for (uint32_t l : back) {
            m_routers[m_links[l].node]->AddFlow(receiver, port, true,
                                                {m_links[l].iface, m_links[l].peer});
        }
        // connect-time lookups (no packet yet) on both hosts go by destination address
        const LinkEnd& first = m_links[path.front()];
        m_routers[first.node]->AddDestination(m_links[path.back()].peer, {first.iface, first.peer});
        const LinkEnd& back_first = m_links[back.front()];
        m_routers[back_first.node]->AddDestination(m_local[path.front()],
                                                   {back_first.iface, back_first.peer});
    }

    void StartFlow(uint32_t id, uint16_t port, uint64_t size, const std::vector<uint32_t>& path,
                   uint32_t send_size) {
        uint32_t src = m_links[path.front()].node;
        uint32_t dst = m_links[path.back() ^ 1u].node;
        Ipv4Address dst_addr = m_links[path.back()].peer;  // receiver's address on the last link
        uint32_t slot = m_rx.size();
        m_rx.push_back(0);
        m_size.push_back(size);
        m_ids.push_back(id);
        Arrived(slot, path);
        Ptr<PacketSink> sink = CreateObject<PacketSink>();
        sink->SetAttribute("Protocol", TypeIdValue(TcpSocketFactory::GetTypeId()));
        sink->SetAttribute("Local", AddressValue(InetSocketAddress(Ipv4Address::GetAny(), port)));
        sink->TraceConnectWithoutContext("Rx",
            Callback<void, Ptr<const Packet>, const Address&>(
                [this, slot](Ptr<const Packet> p, const Address&) { OnRx(slot, p->GetSize()); }));
        m_nodes.Get(dst)->AddApplication(sink);
        Ptr<BulkSendApplication> app = CreateObject<BulkSendApplication>();
        app->SetAttribute("Protocol", TypeIdValue(TcpSocketFactory::GetTypeId()));
        app->SetAttribute("Remote", AddressValue(InetSocketAddress(dst_addr, port)));
        app->SetAttribute("MaxBytes", UintegerValue(size));
        app->SetAttribute("SendSize", UintegerValue(send_size));
        m_nodes.Get(src)->AddApplication(app);
    }

    // queue disc + NIC queue of the link's sending port, bytes
    uint64_t Backlog(uint32_t link) const override {
        const LinkEnd& end = m_links[link];
        return end.qdisc->GetNBytes() + end.device->GetQueue()->GetNBytes();
    }

  private:
    uint32_t FlowId(uint32_t slot) const override { return m_ids[slot]; }
    uint64_t Received(uint32_t slot) const override { return std::min(m_rx[slot], m_size[slot]); }

    void OnRx(size_t slot, uint32_t bytes) {
        uint64_t before = m_rx[slot];
        m_rx[slot] += bytes;
        if (before < m_size[slot] && m_rx[slot] >= m_size[slot]) Delivered(slot);
    }
    NodeContainer m_nodes;
    Ipv4AddressHelper m_addresses;
    std::vector<Ptr<FlowRouting>> m_routers;
    std::vector<LinkEnd> m_links;
    std::vector<Ipv4Address> m_local;
    std::vector<uint64_t> m_rx, m_size;
    std::vector<uint32_t> m_ids;
};

}  // namespace m4ray
"""


def compiled():
    """The ``m4ray`` C++ namespace with this module's network compiled (once per process)."""
    return fabric.compiled(SOURCE)
