"""What both ns-3 fabrics (RDMA in ``rdma.py``, TCP in ``native.py``) share, in C++: the base class
``m4ray::Fabric`` compiled once per process before either.

* Python hooks: ``on_flow_done(flow id, delivery time s)`` and ``on_timer(token)``, with
  ``Schedule(delay ps, token)`` for Python callbacks at a simulated time;
* a wall-clock guard (``Guard``/``Expired``) that stops a run from a periodic simulated event;
* recording for training data (``reference/m4.md`` §10.5): one row per flow arrival/completion,
  the bytes every active flow has received at each, and the backlog of every hop of an arriving
  flow's path. A fabric tells the base a flow's id, its bytes received and a link's backlog.
"""

from __future__ import annotations

import functools

from m4ray.sim.ns3.loader import load

SOURCE = r"""
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace m4ray {
using namespace ns3;

class Fabric {
  public:
    virtual ~Fabric() = default;
    std::function<void(uint32_t, double)> on_flow_done;  // (flow id, delivery time s)
    std::function<void(uint64_t)> on_timer;             // scheduled Python callback token

    void Schedule(int64_t delay_ps, uint64_t token) {
        Simulator::Schedule(PicoSeconds(delay_ps), [this, token]() { on_timer(token); });
    }
    // Stop the run when the wall clock passes `limit_s`; checked every `every_ps` of sim time.
    void Guard(double limit_s, int64_t every_ps) {
        m_limit = limit_s;
        m_every = every_ps;
        m_start = std::chrono::steady_clock::now();
        Simulator::Schedule(PicoSeconds(every_ps), &Fabric::Check, this);
    }
    bool Expired() const { return m_expired; }
    uint32_t Active() const { return m_active; }

    // ---- recording (off by default)
    void Record(bool on) { m_record = on; }
    // one row per event: time (s), flow id, kind (0 arrival, 1 completion)
    std::vector<double> ev_time;
    std::vector<uint32_t> ev_flow;
    std::vector<uint8_t> ev_kind;
    // one row per (event, active flow): bytes received so far (the event's own flow included)
    std::vector<uint32_t> rx_event, rx_flow;
    std::vector<uint64_t> rx_bytes;
    // one row per hop of an arriving flow: backlog of the hop's port, bytes
    std::vector<uint32_t> q_flow, q_hop, q_link;
    std::vector<uint64_t> q_bytes;
    virtual uint64_t Backlog(uint32_t link) const = 0;

  protected:
    virtual uint32_t FlowId(uint32_t slot) const = 0;
    virtual uint64_t Received(uint32_t slot) const = 0;  // capped at the flow's size

    // a flow (fabric slot) starts / is delivered: counts, recording, the Python hook
    void Arrived(uint32_t slot, const std::vector<uint32_t>& path) {
        ++m_active;
        if (!m_record) return;
        for (uint32_t hop = 0; hop < path.size(); ++hop) {
            q_flow.push_back(FlowId(slot));
            q_hop.push_back(hop);
            q_link.push_back(path[hop]);
            q_bytes.push_back(Backlog(path[hop]));
        }
        if (m_pos.size() <= slot) m_pos.resize(slot + 1, 0);
        m_pos[slot] = m_live.size();
        m_live.push_back(slot);
        Snapshot(slot, 0);
    }
    void Delivered(uint32_t slot) {
        --m_active;
        if (m_record) {
            Snapshot(slot, 1);
            size_t at = m_pos[slot], last = m_live.back();  // swap-remove from the live set
            m_live[at] = last;
            m_pos[last] = at;
            m_live.pop_back();
        }
        on_flow_done(FlowId(slot), Simulator::Now().GetSeconds());
    }

  private:
    void Snapshot(uint32_t slot, uint8_t kind) {
        uint32_t event = ev_time.size();
        ev_time.push_back(Simulator::Now().GetSeconds());
        ev_flow.push_back(FlowId(slot));
        ev_kind.push_back(kind);
        for (uint32_t live : m_live) {
            rx_event.push_back(event);
            rx_flow.push_back(FlowId(live));
            rx_bytes.push_back(Received(live));
        }
    }
    void Check() {
        std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - m_start;
        if (elapsed.count() > m_limit) {
            m_expired = true;
            Simulator::Stop();
            return;
        }
        Simulator::Schedule(PicoSeconds(m_every), &Fabric::Check, this);
    }

    uint32_t m_active = 0;
    bool m_record = false;
    std::vector<uint32_t> m_live;  // recording: active slots, and each slot's index in it
    std::vector<size_t> m_pos;
    double m_limit = 0;
    int64_t m_every = 0;
    bool m_expired = false;
    std::chrono::steady_clock::time_point m_start;
};

}  // namespace m4ray
"""


@functools.cache
def compiled(source: str = SOURCE):
    """The ``m4ray`` C++ namespace with ``source`` compiled once per process (ns-3 loaded and
    the ``m4ray::Fabric`` base compiled first)."""
    ns = load()
    if source is not SOURCE:
        compiled()
    ns.cppyy.cppdef(source)
    return ns.cppyy.gbl.m4ray
