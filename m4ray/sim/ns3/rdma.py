"""The RDMA NIC fabric of the ns-3 backend: C++ compiled at run time by cppyy (once per process).

GPU fabrics run RDMA (RoCE): a NIC queue pair starts a flow at line rate with no handshake, bounded
by a window of about one BDP, and DCTCP-style rate control reacts to ECN echoes over a fabric that
PFC keeps lossless (``reference/ns3.md``, transport note). ns-3 has no RDMA module, so this one is
written here, on ns-3's own parts: nodes, ``PointToPointNetDevice``/``PointToPointChannel`` links
(serialisation and propagation, mid-run rate changes), ``Packet`` objects with an m4ray header,
and the ns-3 scheduler. The NIC and switch logic, like the HPCC simulator's, is our own:

* **links** — every directed link is an egress *port*: a high-priority queue (ACK/NACK/PFC
  frames, never paused), a data FIFO (switches) or the queue pairs of a host, and the device's
  one-packet transmit slot, refilled when the device starts sending (no event of our own).
* **NVSwitches** (a SimAI topology's intra-server switches) forward like switches but, as in
  SimAI's ns-3, mark no ECN, never send PFC and never drop (NVLink is credit-based and lossless).
* **switches** forward by source route (the packet's flow and hop index into m4ray's
  :class:`~m4ray.sim.routing.Routing` path), share one buffer per switch, mark ECN (CE) at
  dequeue when the egress FIFO holds more than K bytes (step marking, K per link rate), and send
  PFC PAUSE upstream when an ingress port holds more than the PFC threshold (RESUME two packets
  below it). A data packet that would overflow the shared buffer is dropped and counted.
* **hosts** serve their queue pairs round-robin per port, each paced at its own rate and held to
  its window (optionally scaled by rate/line rate, HPCC's ``VAR_WIN``). The receiver ACKs every
  packet with the CE bit echoed, NACKs the first out-of-order packet (go-back-N), and reports the
  flow done when its last byte arrives in order. DCTCP as rate control: α ← (1−g)α + g·F once per
  window of data, rate ← max(min, rate·(1−α/2)) on an echo outside CWR (once per window), additive
  increase once per window otherwise. A retransmission timer goes back to the last ACK when a
  window sees no progress (needed only when packets are lost).
* **loss** (``error_rate`` of a cable) drops data and ACK packets at the receiving end with a
  seeded ns-3 random stream; PFC frames are never dropped (a lost RESUME would stall a port).

Python hooks, the wall-clock guard and recording (training data) come from ``m4ray::Fabric``
(``fabric.py``); a link's recorded backlog is its control and data queues plus the device slot.
"""

from __future__ import annotations

from m4ray.sim.ns3 import fabric

SOURCE = r"""
#include <algorithm>
#include <cmath>
#include <deque>
#include <string>
#include <functional>
#include <limits>
#include <vector>

namespace m4ray {
using namespace ns3;

enum : uint8_t { kData = 0, kAck = 1, kNack = 2, kPause = 3, kResume = 4 };
enum : uint8_t { kCe = 1 };
// congestion controls (the reference simulator's CC_MODE 8, 1, 3, 7)
enum : uint8_t { kDctcp = 0, kDcqcn = 1, kHpcc = 2, kTimely = 3 };
const uint32_t kNoAux = 0xFFFFFFFFu;
const uint32_t kMaxHops = 8;

struct IntHop {  // one switch egress's in-band telemetry, written as a packet leaves it
    int64_t ts = 0;       // ps
    uint64_t tx = 0;      // bytes the port had sent before this packet
    uint64_t qlen = 0;    // bytes queued at the port after this packet left
    double rate = 0;      // the port's line rate, bits/s
};
struct IntRecord {
    uint32_t n = 0;
    IntHop hop[kMaxHops];
};
// node kinds: hosts, fabric switches (shared buffer, ECN, PFC) and NVSwitches (none of those)
enum : uint8_t { kHost = 0, kFabricSwitch = 1, kNvSwitch = 2 };

// 20 bytes on the wire; the rest of the wire format's per-packet header is padding.
class RdmaHeader : public Header {
  public:
    uint32_t flow = 0;     // fabric slot of the flow
    uint64_t seq = 0;      // data: first payload byte; ACK/NACK: next byte expected
    uint32_t in_link = 0;  // switch: the link the packet came in on (for buffer accounting)
    uint8_t type = kData, flags = 0, hop = 0;
    uint32_t aux = kNoAux;  // HPCC: the packet's INT record (data; echoed on its ACK)
    int64_t ts = 0;         // data: send time, ps (echoed on its ACK: TIMELY's RTT)

    static TypeId GetTypeId() {
        static TypeId tid = TypeId("m4ray::RdmaHeader")
                                .SetParent<Header>()
                                .SetGroupName("Network")
                                .AddConstructor<RdmaHeader>();
        return tid;
    }
    TypeId GetInstanceTypeId() const override { return GetTypeId(); }
    uint32_t GetSerializedSize() const override { return 32; }
    void Serialize(Buffer::Iterator it) const override {
        it.WriteU32(flow);
        it.WriteU64(seq);
        it.WriteU32(in_link);
        it.WriteU8(type);
        it.WriteU8(flags);
        it.WriteU8(hop);
        it.WriteU8(0);
        it.WriteU32(aux);
        it.WriteU64(uint64_t(ts));
    }
    uint32_t Deserialize(Buffer::Iterator it) override {
        flow = it.ReadU32();
        seq = it.ReadU64();
        in_link = it.ReadU32();
        type = it.ReadU8();
        flags = it.ReadU8();
        hop = it.ReadU8();
        it.ReadU8();
        aux = it.ReadU32();
        ts = int64_t(it.ReadU64());
        return 32;
    }
    void Print(std::ostream& os) const override { os << "flow=" << flow << " seq=" << seq; }
};

struct RdmaParams {
    uint32_t mtu = 1000;          // payload bytes per data packet
    uint32_t header = 48;         // wire bytes per packet besides payload (incl. 2 B PPP)
    uint32_t ack_bytes = 64;      // wire bytes of an ACK/NACK/PFC frame
    double gain = 1.0 / 16;       // DCTCP g
    double alpha_init = 1.0;      // DCTCP α of a new flow
    double rate_ai = 615e6;       // bits/s added once per window
    double min_rate = 1e9;        // bits/s
    bool var_window = true;       // window scales with rate / line rate
    uint64_t buffer = 4000000;    // shared buffer per switch, bytes
    bool pfc = true;
    uint64_t pfc_threshold = 500000;  // bytes held from one ingress port before PAUSE
    uint32_t pfc_shift = 0;       // >0: dynamic threshold, (buffer − used) >> shift (reference)
    int64_t rto_ps = 1000000000;  // retransmission timeout
    double max_rate = 0;          // bits/s cap on every sender (0: the NIC's line rate)
    uint8_t cc = kDctcp;
    double cc_ai = 0, cc_hai = 0;  // DCQCN, HPCC, TIMELY: additive and hyper increase, bits/s
    // DCQCN
    double dcqcn_gain = 1.0 / 256;
    int64_t alpha_ps = 1000000, decrease_ps = 4000000, increase_ps = 300000000;
    uint32_t fast_recovery = 5;
    bool clamp = false;
    double first_cnp = 1.0;
    // HPCC
    double eta = 0.95;
    uint32_t max_stage = 0;
    bool fast_react = true;
    int64_t base_rtt_ps = 0;
    uint32_t int_bytes = 0;       // wire bytes telemetry adds to a data packet (HPCC, TIMELY)
    uint32_t ack_int_bytes = 0;   // ... and to an ACK (HPCC)
    bool ack_high = true;         // ACKs in switches' high-priority queue (else with the data)
    bool cc_nic_rate = false;     // the m3 fork: CC reference rates at the NIC's rate, not max
    bool round_ns = false;        // every packet's time on a wire and pacing gap in whole ns
    bool dctcp_reference = false; // DCTCP's α batches as the reference (HandleAckDctcp)
    bool done_at_ack = false;     // a flow is done when its sender has the last ACK
    bool feed_idle = false;       // pick a port's next packet when its wire goes idle
    bool nic_wake_simai = false;  // a NIC's retry as SimAI's DequeueAndTransmit schedules it
    // TIMELY
    double t_low_ps = 50e6, t_high_ps = 500e6, beta = 0.8, ewma = 0.875, min_rtt_ps = 20e6;
};

struct Qp {  // sender state of one flow
    uint64_t size = 0, snd_nxt = 0, snd_una = 0, high_tx = 0, window = 0;
    uint32_t port = 0;
    double line_rate = 0, rate = 0;
    double nic_rate = 0;          // the rate the CC's reference rates start at and cap to
    int64_t next_ps = 0;          // pacing: earliest time of the next packet
    // DCTCP
    double alpha = 1.0;
    uint64_t batch_end = 0, high_seq = 0;
    uint32_t batch_acks = 0, batch_marks = 0;
    bool cwr = false, first_batch = true;
    // retransmission timer
    bool timer = false;
    uint64_t una_at_arm = 0;
    bool active = true;           // still in its port's round-robin list
    // DCQCN
    double target = 0, alpha_d = 1;
    bool alpha_cnp = false, decrease_cnp = false, first_cnp = true;
    uint32_t stage = 0;
    EventId ev_alpha, ev_decrease, ev_increase;
    // HPCC and TIMELY: the last full update's sequence, current rate and increase stage
    uint64_t last_update = 0;
    double cur_rate = 0, u = 1;
    uint32_t inc_stage = 0;
    IntRecord hops;
    uint32_t last_wire = 0;      // the last data packet's wire bytes (HPCC's rate change)
    double last_rtt = 0, rtt_diff = 0;  // TIMELY, ps
};

struct Rx {  // receiver state of one flow
    uint64_t expected = 0;
    bool nacked = false, done = false;
};

struct Port {  // one directed link's sending end
    uint32_t node = 0, peer = 0;
    Ptr<PointToPointNetDevice> device;
    Ptr<UniformRandomVariable> loss_rng;  // on the receiving end
    double loss = 0, rate = 0;  // receiving-end loss probability; bits/s
    uint64_t ecn_k = 0;
    uint64_t red_min = 0, red_max = 0;   // DCQCN's RED marking (bytes) and its top probability
    double red_p = 0;
    Ptr<UniformRandomVariable> mark_rng;
    uint64_t tx_bytes = 0;        // bytes sent (switches: HPCC's INT)
    uint64_t sent_bytes = 0;      // every frame put on the wire (data, ACKs, control)
    uint64_t marked = 0;          // data packets this port marked CE
    std::deque<Ptr<Packet>> hi, data;
    uint64_t hi_bytes = 0, data_bytes = 0;
    std::vector<uint32_t> qps;    // hosts: flows sending on this port
    size_t rr = 0;
    bool paused = false;          // PAUSE received from the peer
    bool pause_sent = false;      // we paused the peer (ingress accounting of this link at peer)
    uint64_t ingress = 0;         // bytes that came in over this link and sit in peer's buffer
    int64_t wake_ps = std::numeric_limits<int64_t>::max();
    bool busy = false;            // feed_idle: a packet is on the wire
};

class RdmaNetwork : public Fabric {
  public:
    // counters (whole run)
    uint64_t drops = 0, timeouts = 0, pauses = 0, marks = 0, retransmits = 0, nacks = 0;
    uint64_t max_queue = 0;  // the most data bytes any fabric switch port held at once
    double queue_sum = 0;    // Σ over data packets entering a fabric switch port: bytes queued
    uint64_t queue_samples = 0;

    RdmaNetwork(uint32_t n_nodes, const std::vector<uint8_t>& is_switch, RdmaParams params)
        : m_p(params), m_switch(is_switch), m_used(n_nodes, 0) {
        m_nodes.Create(n_nodes);
    }

    // A full-duplex cable a<->b; links 2*i (a->b) and 2*i+1 (b->a).
    void AddLink(uint32_t a, uint32_t b, double rate_bps, int64_t delay_ps, uint64_t ecn_k,
                 double error_rate) {
        PointToPointHelper p2p;
        p2p.SetDeviceAttribute("DataRate", DataRateValue(DataRate(uint64_t(rate_bps))));
        p2p.SetDeviceAttribute("Mtu", UintegerValue(65000));
        p2p.SetChannelAttribute("Delay", TimeValue(PicoSeconds(delay_ps)));
        p2p.SetQueue("ns3::DropTailQueue<Packet>", "MaxSize", StringValue("1p"));
        NetDeviceContainer devs = p2p.Install(m_nodes.Get(a), m_nodes.Get(b));
        for (int side = 0; side < 2; ++side) {
            uint32_t link = m_ports.size();
            Port port;
            port.node = side == 0 ? a : b;
            port.peer = side == 0 ? b : a;
            port.device = DynamicCast<PointToPointNetDevice>(devs.Get(side));
            port.ecn_k = ecn_k;
            port.rate = rate_bps;
            port.loss = error_rate;
            port.loss_rng = CreateObject<UniformRandomVariable>();
            port.loss_rng->SetStream(1000 + link);
            m_ports.push_back(port);
            port.device->TraceConnectWithoutContext(
                "PhyTxBegin",
                Callback<void, Ptr<const Packet>>([this, link](Ptr<const Packet> p) {
                    if (m_p.round_ns) WholeNs(link, p);
                    if (m_p.feed_idle) m_ports[link].busy = true;
                    else Feed(link);
                }));
            // feed_idle: the next packet is chosen as the wire goes idle (SimAI's switches
            // mark ECN and hosts pick a queue pair at that instant), not one packet early
            port.device->TraceConnectWithoutContext(
                "PhyTxEnd", Callback<void, Ptr<const Packet>>([this, link](Ptr<const Packet>) {
                    if (!m_p.feed_idle) return;
                    m_ports[link].busy = false;
                    Simulator::ScheduleNow(&RdmaNetwork::Feed, this, link);
                }));
            // the device at the other end receives this link's packets
            Ptr<NetDevice> rx = devs.Get(1 - side);
            rx->SetReceiveCallback(Callback<bool, Ptr<NetDevice>, Ptr<const Packet>, uint16_t,
                                            const Address&>(
                [this, link](Ptr<NetDevice>, Ptr<const Packet> p, uint16_t, const Address&) {
                    Receive(link, p);
                    return true;
                }));
        }
    }

    // DCQCN's RED marking of a link: none below kmin bytes, all above kmax, linear to p between.
    void SetRed(uint32_t link, uint64_t kmin, uint64_t kmax, double p) {
        Port& port = m_ports[link];
        port.red_min = kmin;
        port.red_max = kmax;
        port.red_p = p;
        port.mark_rng = CreateObject<UniformRandomVariable>();
        port.mark_rng->SetStream(500000 + link);
    }

    // SimAI's ns-3 runs at nanosecond resolution, so a packet's time on a wire is rounded to
    // the ns (1,040 B at 400 Gbit/s: 21 ns, not 20.8; at 2,400 Gbit/s 3 ns, not 3.47). Called
    // on PhyTxBegin, before the device reads its rate for this packet.
    void WholeNs(uint32_t link, Ptr<const Packet> p) {
        Port& port = m_ports[link];
        double bits = p->GetSize() * 8.0;
        int64_t ns = std::llround(bits / port.rate * 1e9);
        double rate = ns == 0 ? 1e18 : bits * 1e9 / double(ns);
        port.device->SetDataRate(DataRate(uint64_t(rate)));
    }

    void SetRate(uint32_t link, double rate_bps) {
        m_ports[link].device->SetDataRate(DataRate(uint64_t(rate_bps)));
        m_ports[link].rate = rate_bps;
    }
    void SetLoss(uint32_t link, double rate) { m_ports[link].loss = rate; }
    uint32_t n_links() const { return m_ports.size(); }
    uint64_t SentBytes(uint32_t link) const { return m_ports[link].sent_bytes; }
    uint64_t Marked(uint32_t link) const { return m_ports[link].marked; }

    // What holds a stalled run: paused links (with the bytes their ingress holds at the far
    // end) and the flows still unacknowledged, for the wall-clock guard's error.
    std::string Stalled() const {
        std::string out;
        uint32_t shown = 0;
        for (uint32_t l = 0; l < m_ports.size(); ++l) {
            const Port& p = m_ports[l];
            if (!p.paused) continue;
            if (shown++ < 12)
                out += " link " + std::to_string(l) + " (" + std::to_string(p.node) + "->" +
                       std::to_string(p.peer) + ", " + std::to_string(p.data_bytes) +
                       " B queued, far end holds " + std::to_string(p.ingress) + " B) paused;";
        }
        if (shown > 12) out += " ... " + std::to_string(shown) + " paused links;";
        uint32_t flows = 0;
        for (uint32_t q = 0; q < m_qp.size(); ++q) {
            if (!m_qp[q].active || m_qp[q].snd_una >= m_qp[q].size) continue;
            const Qp& f = m_qp[q];
            if (flows++ < 4)
                out += " flow " + std::to_string(m_ids[q]) + " acked " +
                       std::to_string(f.snd_una) + ", sent " + std::to_string(f.snd_nxt) + " of " +
                       std::to_string(f.size) + " B, window " + std::to_string(Window(f)) +
                       " B, rate " + std::to_string(f.rate / 1e9) + " Gb/s, received " +
                       std::to_string(m_rx[q].expected) + " B;";
        }
        out += " drops " + std::to_string(drops) + ", timeouts " + std::to_string(timeouts) +
               ", retransmits " + std::to_string(retransmits) + ", pauses " +
               std::to_string(pauses);
        return out;
    }

    // Start flow `id` now over `path` (data) and `back` (ACKs) with a window of `window` bytes.
    void StartFlow(uint32_t id, uint64_t size, const std::vector<uint32_t>& path,
                   const std::vector<uint32_t>& back, uint64_t window) {
        uint32_t slot = m_ids.size();
        m_ids.push_back(id);
        m_path.push_back(path);
        m_back.push_back(back);
        m_rx.emplace_back();
        Qp q;
        q.size = size;
        q.port = path.front();
        q.window = window;
        q.line_rate = m_ports[q.port].rate;
        if (m_p.max_rate > 0) q.line_rate = std::min(q.line_rate, m_p.max_rate);
        q.nic_rate = m_p.cc_nic_rate ? m_ports[q.port].rate : q.line_rate;
        q.rate = q.line_rate;
        q.alpha = m_p.alpha_init;
        q.cur_rate = q.target = q.nic_rate;  // the CC's reference rates
        m_qp.push_back(q);
        Arrived(slot, path);
        if (size == 0) {  // nothing to send: delivered at once
            m_qp[slot].active = false;
            Deliver(slot);
            return;
        }
        m_ports[q.port].qps.push_back(slot);
        Feed(q.port);
    }

    // control + data queues and the device's transmit slot of the link's sending port, bytes
    uint64_t Backlog(uint32_t link) const override {
        const Port& port = m_ports[link];
        return port.hi_bytes + port.data_bytes + port.device->GetQueue()->GetNBytes();
    }

  private:
    uint32_t FlowId(uint32_t slot) const override { return m_ids[slot]; }
    uint64_t Received(uint32_t slot) const override {
        return std::min(m_rx[slot].expected, m_qp[slot].size);
    }

    // ---------------------------------------------------------------- transmit side
    Ptr<Packet> Make(uint32_t wire_bytes, const RdmaHeader& h) const {
        Ptr<Packet> p = Create<Packet>(wire_bytes - 2 - h.GetSerializedSize());
        p->AddHeader(h);
        return p;
    }
    void Control(uint32_t link, uint8_t type, uint32_t slot, uint64_t seq, uint8_t flags,
                 uint8_t hop, uint32_t aux = kNoAux, int64_t ts = 0) {
        RdmaHeader h;
        h.type = type;
        h.flow = slot;
        h.seq = seq;
        h.flags = flags;
        h.hop = hop;
        h.aux = aux;
        h.ts = ts;
        Port& port = m_ports[link];
        bool ack = type == kAck || type == kNack;
        Ptr<Packet> p = Make(m_p.ack_bytes + (ack ? m_p.ack_int_bytes : 0), h);
        port.hi.push_back(p);
        port.hi_bytes += p->GetSize() + 2;
        Feed(link);
    }

    // Fill the device's transmit slot: control frames first, then data unless paused.
    void Feed(uint32_t link) {
        Port& port = m_ports[link];
        if (!port.device->GetQueue()->IsEmpty() || port.busy) return;
        Ptr<Packet> p;
        if (!port.hi.empty()) {
            p = port.hi.front();
            port.hi.pop_front();
            port.hi_bytes -= p->GetSize() + 2;
        } else if (!port.paused) {
            p = m_switch[port.node] ? Dequeue(link) : NextQp(link);
        }
        if (p) {
            port.sent_bytes += p->GetSize() + 2;
            port.device->Send(p, port.device->GetBroadcast(), 0x0800);
        }
    }

    Ptr<Packet> Dequeue(uint32_t link) {
        Port& port = m_ports[link];
        if (port.data.empty()) return nullptr;
        Ptr<Packet> p = port.data.front();
        port.data.pop_front();
        uint64_t wire = p->GetSize() + 2;
        uint64_t queued = port.data_bytes;
        port.data_bytes -= wire;
        RdmaHeader h;
        p->RemoveHeader(h);
        // data only (an ACK's CE bit is its echo): DCQCN's RED on what stays queued, as the
        // reference judges it; DCTCP's step on the queue the packet leaves
        bool mark = h.type == kData && (port.red_max > 0 ? Red(port) : queued > port.ecn_k);
        if (mark) {
            h.flags |= kCe;
            ++marks;
            ++port.marked;
        }
        if (h.type == kData && h.aux != kNoAux) {  // HPCC: this egress's telemetry
            IntRecord& rec = m_int[h.aux];
            if (rec.n < kMaxHops) {
                IntHop& hop = rec.hop[rec.n++];
                hop.ts = Simulator::Now().GetPicoSeconds();
                hop.tx = port.tx_bytes;
                hop.qlen = port.data_bytes + port.hi_bytes;
                hop.rate = port.rate;
            }
        }
        port.tx_bytes += wire;
        uint32_t in = h.in_link;
        p->AddHeader(h);
        m_used[port.node] -= wire;
        Port& ingress = m_ports[in];
        ingress.ingress -= wire;
        uint64_t margin = 2 * (m_p.mtu + m_p.header);
        uint64_t threshold = PfcThreshold(port.node);
        uint64_t resume_below = threshold > margin ? threshold - margin : 0;
        if (ingress.pause_sent && ingress.ingress <= resume_below) {
            ingress.pause_sent = false;
            Control(in ^ 1u, kResume, 0, 0, 0, 0);
        }
        return p;
    }

    // What one ingress port may hold before the switch pauses its upstream: a fixed share, or
    // (the reference's dynamic threshold) a share of the buffer still free.
    uint64_t PfcThreshold(uint32_t node) const {
        if (m_p.pfc_shift == 0) return m_p.pfc_threshold;
        uint64_t used = std::min(m_used[node], m_p.buffer);
        return (m_p.buffer - used) >> m_p.pfc_shift;
    }

    bool Red(Port& port) {
        uint64_t q = port.data_bytes;
        if (q > port.red_max) return true;
        if (q <= port.red_min) return false;
        double p = port.red_p * double(q - port.red_min) / double(port.red_max - port.red_min);
        return port.mark_rng->GetValue() < p;
    }

    // Round-robin over the port's queue pairs: the next one allowed by window and pacing.
    Ptr<Packet> NextQp(uint32_t link) {
        Port& port = m_ports[link];
        constexpr int64_t never = std::numeric_limits<int64_t>::max();
        int64_t now = Simulator::Now().GetPicoSeconds();
        int64_t earliest = never;
        size_t n = port.qps.size();
        for (size_t i = 0; i < n; ++i) {
            size_t at = (port.rr + i) % n;
            uint32_t slot = port.qps[at];
            Qp& q = m_qp[slot];
            if (q.snd_nxt >= q.size) continue;
            if (m_p.nic_wake_simai) earliest = std::min(earliest, q.next_ps);
            if (q.snd_nxt - q.snd_una >= Window(q)) continue;
            if (q.next_ps > now) {
                earliest = std::min(earliest, q.next_ps);
                continue;
            }
            port.rr = at + 1;
            return DataPacket(slot, now);
        }
        // SimAI's device retries at the earliest next-send time over its queue pairs with bytes
        // left, window-bound ones included, only if that is still ahead and none is pending
        // (else the next ACK in or transmit done wakes it); ours at the earliest ready pair's,
        // superseding a later retry
        bool retry = m_p.nic_wake_simai
                         ? earliest > now && earliest != never && port.wake_ps == never
                         : earliest != never && earliest < port.wake_ps;
        if (retry) {
            port.wake_ps = earliest;
            Simulator::Schedule(PicoSeconds(earliest - now), &RdmaNetwork::Wake, this, link);
        }
        return nullptr;
    }
    void Wake(uint32_t link) {
        Port& port = m_ports[link];
        if (Simulator::Now().GetPicoSeconds() < port.wake_ps) return;  // superseded
        port.wake_ps = std::numeric_limits<int64_t>::max();
        Feed(link);
    }
    uint64_t Window(const Qp& q) const {
        if (q.window == 0) return std::numeric_limits<uint64_t>::max();
        if (!m_p.var_window) return q.window;
        return std::max<uint64_t>(1, uint64_t(q.window * (q.rate / q.line_rate)));
    }

    Ptr<Packet> DataPacket(uint32_t slot, int64_t now) {
        Qp& q = m_qp[slot];
        uint64_t payload = std::min<uint64_t>(m_p.mtu, q.size - q.snd_nxt);
        RdmaHeader h;
        h.type = kData;
        h.flow = slot;
        h.seq = q.snd_nxt;
        h.ts = now;
        if (m_p.cc == kHpcc) h.aux = NewRecord();
        if (q.snd_nxt < q.high_tx) ++retransmits;
        q.snd_nxt += payload;
        q.high_tx = std::max(q.high_tx, q.snd_nxt);
        uint32_t wire = payload + m_p.header + m_p.int_bytes;
        q.last_wire = wire;
        q.next_ps = now + (m_p.round_ns ? std::llround(wire * 8.0 / q.rate * 1e9) * 1000
                                        : int64_t(wire * 8.0 / q.rate * 1e12));
        if (!q.timer) Arm(slot);
        return Make(wire, h);
    }

    // ---------------------------------------------------------------- receive side
    void Receive(uint32_t link, Ptr<const Packet> in) {
        Port& port = m_ports[link];
        RdmaHeader h;
        in->PeekHeader(h);
        if (h.type == kPause || h.type == kResume) {  // peer tells us about our port to it
            Port& mine = m_ports[link ^ 1u];
            mine.paused = h.type == kPause;
            if (h.type == kPause) ++pauses;
            else Feed(link ^ 1u);
            return;
        }
        if (port.loss > 0 && port.loss_rng->GetValue() < port.loss) {  // lost on the wire
            FreeRecord(h.aux);
            return;
        }
        const std::vector<uint32_t>& route = h.type == kData ? m_path[h.flow] : m_back[h.flow];
        if (h.hop + 1u == route.size()) {
            if (h.type == kData) OnData(h, in->GetSize() + 2);
            else OnAck(h);
            return;
        }
        Ptr<Packet> p = in->Copy();
        p->RemoveHeader(h);
        ++h.hop;
        uint32_t out = route[h.hop];
        Port& next = m_ports[out];
        uint64_t wire = p->GetSize() + h.GetSerializedSize() + 2;
        if (h.type != kData && m_p.ack_high) {
            p->AddHeader(h);
            next.hi.push_back(p);
            next.hi_bytes += wire;
            Feed(out);
            return;
        }
        uint32_t node = port.peer;
        bool fabric = m_switch[node] == kFabricSwitch;  // NVSwitches: no buffer limit, no PFC
        if (fabric && m_used[node] + wire > m_p.buffer) {
            ++drops;
            FreeRecord(h.aux);
            return;
        }
        h.in_link = link;
        p->AddHeader(h);
        m_used[node] += wire;
        port.ingress += wire;
        if (fabric && m_p.pfc && !port.pause_sent && port.ingress > PfcThreshold(node)) {
            port.pause_sent = true;
            Control(link ^ 1u, kPause, 0, 0, 0, 0);
        }
        next.data.push_back(p);
        next.data_bytes += wire;
        if (fabric && h.type == kData) {
            if (next.data_bytes > max_queue) max_queue = next.data_bytes;
            queue_sum += double(next.data_bytes - wire);  // what the packet found there
            ++queue_samples;
        }
        Feed(out);
    }

    void OnData(const RdmaHeader& h, uint64_t wire) {
        uint32_t slot = h.flow;
        Rx& r = m_rx[slot];
        uint32_t back = m_back[slot].front();
        uint64_t payload = wire - m_p.header - m_p.int_bytes;
        // the ACK echoes the data's mark (DCQCN's CNP), send time and telemetry
        uint8_t ce = h.flags & kCe;
        if (h.seq == r.expected) {
            r.expected += payload;
            r.nacked = false;
            Control(back, kAck, slot, r.expected, ce, 0, h.aux, h.ts);
            if (!r.done && r.expected >= m_qp[slot].size) {
                if (m_p.done_at_ack) r.done = true;  // done once the sender has this ACK
                else Deliver(slot);
            }
        } else if (h.seq > r.expected) {
            if (!r.nacked) {
                r.nacked = true;
                ++nacks;
                Control(back, kNack, slot, r.expected, ce, 0, h.aux, h.ts);
            } else {
                FreeRecord(h.aux);
            }
        } else {
            Control(back, kAck, slot, r.expected, ce, 0, h.aux, h.ts);
        }
    }
    void Deliver(uint32_t slot) {
        m_rx[slot].done = true;
        Delivered(slot);
    }

    void OnAck(const RdmaHeader& h) {
        uint32_t slot = h.flow;
        Qp& q = m_qp[slot];
        if (!q.active) {  // a late ACK of a finished flow: only its telemetry to give back
            FreeRecord(h.aux);
            return;
        }
        if (h.seq > q.snd_una) q.snd_una = h.seq;
        if (h.type == kNack && q.snd_nxt > h.seq) q.snd_nxt = std::max(h.seq, q.snd_una);
        // an ACK can overtake a go-back (bytes of an earlier round arrive after a timeout
        // rewound): never send below what is acknowledged (the window arithmetic needs it)
        if (q.snd_nxt < q.snd_una) q.snd_nxt = q.snd_una;
        switch (m_p.cc) {
            case kDcqcn:
                if (h.flags & kCe) Cnp(slot);
                break;
            case kHpcc:
                Hpcc(q, h);
                break;
            case kTimely:
                Timely(q, h);
                break;
            default:
                Dctcp(q, h.seq, h.flags & kCe);
        }
        FreeRecord(h.aux);
        if (q.snd_una >= q.size) {
            q.active = false;
            if (m_p.done_at_ack) Delivered(slot);  // SimAI's QpComplete: the last ACK is in
            Simulator::Cancel(q.ev_alpha);
            Simulator::Cancel(q.ev_decrease);
            Simulator::Cancel(q.ev_increase);
            Port& port = m_ports[q.port];
            auto it = std::find(port.qps.begin(), port.qps.end(), slot);
            size_t at = it - port.qps.begin();
            port.qps.erase(it);
            if (port.rr > at) --port.rr;
        }
        Feed(q.port);
    }

    void Dctcp(Qp& q, uint64_t ack, bool ce) {
        if (m_p.dctcp_reference) return DctcpReference(q, ack, ce);
        ++q.batch_acks;
        if (ce) ++q.batch_marks;
        bool new_batch = false;
        if (ack >= q.batch_end) {  // a window of data has been acknowledged since the last one
            if (!q.first_batch) {
                double f = double(q.batch_marks) / q.batch_acks;
                q.alpha = (1 - m_p.gain) * q.alpha + m_p.gain * f;
            }
            q.first_batch = false;
            q.batch_acks = q.batch_marks = 0;
            q.batch_end = q.snd_nxt;
            new_batch = true;
        }
        if (q.cwr && ack > q.high_seq) q.cwr = false;
        if (ce && !q.cwr) {
            q.rate = std::max(m_p.min_rate, q.rate * (1 - q.alpha / 2));
            q.cwr = true;
            q.high_seq = q.snd_nxt;
        } else if (new_batch && !q.cwr) {
            q.rate = std::min(q.line_rate, q.rate + m_p.rate_ai);
        }
    }

    // The reference's α bookkeeping (HPCC's and SimAI's rdma-hw.cc, HandleAckDctcp): a batch
    // ends on an ACK strictly beyond the data sent when it began; F = marks / (packets in
    // flight when it began + 1); the first batch only sets the mark and does not reset marks.
    void DctcpReference(Qp& q, uint64_t ack, bool ce) {
        if (ce) ++q.batch_marks;
        bool new_batch = false;
        if (ack > q.batch_end) {
            new_batch = true;
            if (q.batch_end == 0) {
                q.batch_acks = uint32_t(q.snd_nxt / m_p.mtu + 1);
            } else {
                double f = std::min(1.0, double(q.batch_marks) / q.batch_acks);
                q.alpha = (1 - m_p.gain) * q.alpha + m_p.gain * f;
                q.batch_marks = 0;
                q.batch_acks = uint32_t((q.snd_nxt - ack) / m_p.mtu + 1);
            }
            q.batch_end = q.snd_nxt;
        }
        if (q.cwr && ack > q.high_seq) q.cwr = false;
        if (ce && !q.cwr) {
            q.rate = std::max(m_p.min_rate, q.rate * (1 - q.alpha / 2));
            q.cwr = true;
            q.high_seq = q.snd_nxt;
        } else if (new_batch && !q.cwr) {
            q.rate = std::min(q.line_rate, q.rate + m_p.rate_ai);
        }
    }

    // ---------------------------------------------------------------- DCQCN (CC_MODE 1)
    // The receiver echoes every mark on its ACK (a CNP); the sender's α, rate cuts and rate
    // increases run on their own timers, started by the first CNP.
    void Cnp(uint32_t slot) {
        Qp& q = m_qp[slot];
        q.alpha_cnp = q.decrease_cnp = true;
        if (!q.first_cnp) return;
        q.first_cnp = false;
        q.alpha_d = 1;
        q.alpha_cnp = false;
        q.ev_alpha = Simulator::Schedule(PicoSeconds(m_p.alpha_ps), &RdmaNetwork::DcqcnAlpha,
                                         this, slot);
        q.ev_decrease = Simulator::Schedule(PicoSeconds(m_p.decrease_ps + 1000),
                                            &RdmaNetwork::DcqcnDecrease, this, slot);
        q.target = q.rate = m_p.first_cnp * q.rate;
    }
    void DcqcnAlpha(uint32_t slot) {
        Qp& q = m_qp[slot];
        q.alpha_d = (1 - m_p.dcqcn_gain) * q.alpha_d + (q.alpha_cnp ? m_p.dcqcn_gain : 0.0);
        q.alpha_cnp = false;
        q.ev_alpha = Simulator::Schedule(PicoSeconds(m_p.alpha_ps), &RdmaNetwork::DcqcnAlpha,
                                         this, slot);
    }
    void DcqcnDecrease(uint32_t slot) {
        Qp& q = m_qp[slot];
        if (q.decrease_cnp) {
            if (m_p.clamp || q.stage != 0) q.target = q.rate;
            q.rate = std::max(m_p.min_rate, q.rate * (1 - q.alpha_d / 2));
            q.stage = 0;
            q.decrease_cnp = false;
            Simulator::Cancel(q.ev_increase);
            q.ev_increase = Simulator::Schedule(PicoSeconds(m_p.increase_ps),
                                                &RdmaNetwork::DcqcnIncrease, this, slot);
        }
        q.ev_decrease = Simulator::Schedule(PicoSeconds(m_p.decrease_ps),
                                            &RdmaNetwork::DcqcnDecrease, this, slot);
    }
    void DcqcnIncrease(uint32_t slot) {
        Qp& q = m_qp[slot];
        q.ev_increase = Simulator::Schedule(PicoSeconds(m_p.increase_ps),
                                            &RdmaNetwork::DcqcnIncrease, this, slot);
        if (q.stage == m_p.fast_recovery) q.target = std::min(q.nic_rate, q.target + m_p.cc_ai);
        else if (q.stage > m_p.fast_recovery)
            q.target = std::min(q.nic_rate, q.target + m_p.cc_hai);
        q.rate = q.rate / 2 + q.target / 2;  // fast recovery, or toward the raised target
        ++q.stage;
    }

    // ---------------------------------------------------------------- HPCC (CC_MODE 3)
    // Per ACK: the path's most-utilised hop from the echoed telemetry against the last (a full
    // update once per window of data; the others "fast react" from the same reference).
    void Hpcc(Qp& q, const RdmaHeader& h) {
        if (h.aux == kNoAux) return;
        const IntRecord& rec = m_int[h.aux];
        bool full = h.seq > q.last_update;
        if (!full && !m_p.fast_react) return;
        if (q.last_update == 0) {  // the first window: keep the reference
            q.last_update = q.snd_nxt;
            q.hops = rec;
            return;
        }
        double U = 0;
        int64_t dt = 0;
        bool any = false;
        for (uint32_t i = 0; i < rec.n && i < q.hops.n; ++i) {
            const IntHop& now = rec.hop[i];
            const IntHop& was = q.hops.hop[i];
            int64_t tau = now.ts - was.ts;
            if (tau <= 0) continue;
            any = true;
            double tx_rate = double(now.tx - was.tx) * 8 / (tau * 1e-12);
            double u = tx_rate / now.rate + double(std::min(now.qlen, was.qlen)) * q.line_rate /
                                                 now.rate / double(q.window);
            if (u > U) {
                U = u;
                dt = tau;
            }
        }
        q.hops = rec;  // the reference moves on every ACK it reads (reference: fast react too)
        if (any) {
            int64_t T = m_p.base_rtt_ps;
            dt = std::min(dt, T);
            double util = (q.u * double(T - dt) + U * double(dt)) / double(T);
            double max_c = util / m_p.eta;
            double rate;
            uint32_t stage;
            if (max_c >= 1 || q.inc_stage >= m_p.max_stage) {
                rate = q.cur_rate / max_c + m_p.cc_ai;
                stage = 0;
            } else {
                rate = q.cur_rate + m_p.cc_ai;
                stage = q.inc_stage + 1;
            }
            rate = std::min(q.line_rate, std::max(m_p.min_rate, rate));
            ChangeRate(q, rate);
            q.u = util;
            if (full) {  // the rate the next round starts from: once per window of data
                q.cur_rate = rate;
                q.inc_stage = stage;
            }
        }
        if (full && q.snd_nxt > q.last_update) q.last_update = q.snd_nxt;
    }
    void ChangeRate(Qp& q, double rate) {  // the next packet's gap follows the new rate
        if (q.last_wire > 0)
            q.next_ps += int64_t(q.last_wire * 8.0 * (1 / rate - 1 / q.rate) * 1e12);
        q.rate = rate;
    }
    uint32_t NewRecord() {
        uint32_t at;
        if (!m_int_free.empty()) {
            at = m_int_free.back();
            m_int_free.pop_back();
        } else {
            at = m_int.size();
            m_int.emplace_back();
        }
        m_int[at].n = 0;
        return at;
    }
    void FreeRecord(uint32_t aux) {
        if (aux != kNoAux) m_int_free.push_back(aux);
    }

    // ---------------------------------------------------------------- TIMELY (CC_MODE 7)
    // Once per window of data: the RTT of the ACKed packet and its EWMA gradient set the rate.
    void Timely(Qp& q, const RdmaHeader& h) {
        if (h.seq <= q.last_update) return;
        double rtt = double(Simulator::Now().GetPicoSeconds() - h.ts);
        if (q.last_update != 0) {
            double diff = (1 - m_p.ewma) * q.rtt_diff + m_p.ewma * (rtt - q.last_rtt);
            double gradient = diff / m_p.min_rtt_ps;
            bool increase = false;
            double c = 0;
            if (rtt < m_p.t_low_ps) increase = true;
            else if (rtt > m_p.t_high_ps) c = 1 - m_p.beta * (1 - m_p.t_high_ps / rtt);
            else if (gradient <= 0) increase = true;
            else c = std::max(0.0, 1 - m_p.beta * gradient);
            if (increase) {
                double step = q.inc_stage < 5 ? m_p.cc_ai : m_p.cc_hai;
                q.rate = std::min(q.line_rate, q.cur_rate + step);
                ++q.inc_stage;
            } else {
                q.rate = std::max(m_p.min_rate, q.cur_rate * c);
                q.inc_stage = 0;
            }
            q.cur_rate = q.rate;
            q.rtt_diff = diff;
        }
        q.last_update = q.snd_nxt;
        q.last_rtt = rtt;
    }

    void Arm(uint32_t slot) {
        Qp& q = m_qp[slot];
        q.timer = true;
        q.una_at_arm = q.snd_una;
        Simulator::Schedule(PicoSeconds(m_p.rto_ps), &RdmaNetwork::Timeout, this, slot);
    }
    void Timeout(uint32_t slot) {
        Qp& q = m_qp[slot];
        q.timer = false;
        if (!q.active || q.snd_una >= q.size) return;
        if (q.snd_una == q.una_at_arm && q.snd_nxt > q.snd_una) {  // a whole RTO, no progress
            ++timeouts;
            q.snd_nxt = q.snd_una;
            q.next_ps = 0;
            Feed(q.port);
        }
        Arm(slot);  // still active: bytes unacknowledged
    }

    RdmaParams m_p;
    std::vector<uint8_t> m_switch;
    std::vector<uint64_t> m_used;  // shared buffer in use per node (switches), bytes
    NodeContainer m_nodes;
    std::vector<Port> m_ports;
    std::vector<uint32_t> m_ids;
    std::vector<std::vector<uint32_t>> m_path, m_back;
    std::vector<Qp> m_qp;
    std::vector<Rx> m_rx;
    std::vector<IntRecord> m_int;  // HPCC: telemetry of packets in flight (header's aux)
    std::vector<uint32_t> m_int_free;
};

}  // namespace m4ray
"""


def compiled():
    """The ``m4ray`` C++ namespace with this module's network compiled (once per process)."""
    return fabric.compiled(SOURCE)
