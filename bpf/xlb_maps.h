/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Every map of the program. All are pinned by name under the plane's bpffs
 * directory, so a restarted daemon adopts them (and the connections in them).
 */
#ifndef XLB_MAPS_H
#define XLB_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "xlb_consts.h"
#include "xlb_structs.h"

/* (VIP, port, proto) -> current generation of the service. Flipping one
 * entry switches a service to a new set of slots and backends atomically. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc_key);
	__type(value, struct svc_val);
	__uint(max_entries, XLB_MAX_SERVICES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_services SEC(".maps");

/* (generation, slot) -> backend id. Weighted schedulers repeat a backend in
 * proportion to its weight. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct slot_key);
	__type(value, __u32);
	__uint(max_entries, XLB_MAX_SLOTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_slots SEC(".maps");

/* backend id -> real server. Ids belong to one service generation. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct backend);
	__uint(max_entries, XLB_MAX_BACKENDS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_backends SEC(".maps");

/* backend id -> XLB_BE_F_* (0: up) | counter slot << XLB_BE_SLOT_SHIFT,
 * what the conntrack-hit path checks on every packet: an array, so the
 * lookup is inlined and costs a few ns where a hash lookup in xlb_backends
 * costs tens. Ids beyond the array have no flags and no counters. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, XLB_MAX_BACKENDS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_be_flags SEC(".maps");

/* generation id -> round-robin counter (atomic, shared by all CPUs). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, XLB_MAX_SVC_IDS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_rr SEC(".maps");

/* Connection tracking: one entry per direction of each flow. LRU: when full,
 * the least recently used entries go first (see docs/dataplane-ebpf.md on
 * how an evicted direction is repaired from its peer). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_val);
	__uint(max_entries, XLB_CT_SIZE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_ct SEC(".maps");

/* Persistence (farm persistence, persist-ttl): the last backend of each
 * client of a service. LRU: the oldest clients go first when full; an
 * entry older than the service's TTL is ignored and overwritten. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct persist_key);
	__type(value, struct persist_val);
	__uint(max_entries, XLB_MAX_PERSIST);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_persist SEC(".maps");

/* Static sessions (nftlb's "sessions"): a client of a service (keyed as
 * xlb_persist is) -> its backend, by configuration: looked up before
 * xlb_persist when svc_val.persist has XLB_HASH_STATIC; seen is unused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct persist_key);
	__type(value, struct persist_val);
	__uint(max_entries, XLB_MAX_STATIC);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_static SEC(".maps");

/* (generation, backend address, port) -> backend id: finds a persistent
 * client's backend in the current generation of its service. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct be_index_key);
	__type(value, __u32);
	__uint(max_entries, XLB_MAX_BACKENDS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_be_index SEC(".maps");

/* stlsdnat: backend (address, port, proto) -> (VIP, port) its replies
 * leave with. A backend serves at most one stlsdnat farm. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct stl_key);
	__type(value, struct stl_val);
	__uint(max_entries, XLB_MAX_BACKENDS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_stateless SEC(".maps");

/* Per-CPU scratch space (the 512-byte BPF stack is too small for all of
 * a new flow's entries). Not pinned: it holds nothing between packets. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct scratch);
	__uint(max_entries, 1);
} xlb_scratch SEC(".maps");

/* Per-CPU counters indexed by enum xlb_stat. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, XLB_STAT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_stats SEC(".maps");

/* counter slot -> per-CPU packet, byte and connection counters of a
 * backend (ipvsadm --stats). The loader gives each backend id a slot (in
 * its xlb_be_flags value), zeroed, and takes it back with the id. A per-CPU
 * array, so counting costs an inlined lookup (a per-CPU hash by backend id
 * cost ~27 ns per packet). Slot 0 is never given. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct be_stats);
	__uint(max_entries, XLB_MAX_STAT_SLOTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_be_stats SEC(".maps");

/* generation id -> XLB_SVC_F_* (an array: inlined, read on new flows). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, XLB_MAX_SVC_IDS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_svc_flags SEC(".maps");

/* Connection log: a struct conn_event per new connection of a farm with
 * XLB_SVC_F_LOG, read by the daemon. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, XLB_EVENTS_SIZE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_events SEC(".maps");

/* ifindex -> 1 for the interfaces the XDP fast path may redirect to in
 * native mode (those with an XDP program of ours: their driver transmits
 * XDP frames); see xlb_xdp_any_tx. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_xdp_tx SEC(".maps");

/* ifindex -> 1 for the veth and netkit interfaces of the namespace whose
 * peer is in another network namespace (written by the loader): a next hop
 * there is sent with bpf_redirect_peer, which hands the packet to the
 * peer's ingress without a transmit (no qdisc, veth_xmit, backlog). The
 * kernel drops a peer redirect to any other device, so only these. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_peer_tx SEC(".maps");

/* (bridge ifindex, MAC) -> ifindex of the bridge port the MAC was learnt
 * on, for ports that take a peer redirect (in xlb_peer_tx), on bridges
 * without VLAN filtering; written by the loader from the bridges'
 * forwarding databases only with --bridge-port-redirect (empty otherwise).
 * A next hop behind such a port is sent to the port's peer with
 * bpf_redirect_peer: straight into the container's namespace, without the
 * bridge's and the veth's transmit. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct br_port_key);
	__type(value, __u32);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_br_port SEC(".maps");

/* The MAC addresses of this namespace's interfaces (bridges, macvlans,
 * VRRP's virtual MACs included), written by the loader before it attaches
 * and kept by its link watch. A frame the kernel marks PACKET_OTHERHOST on
 * the interface it came in on (a bridge or switch flooding it, a
 * promiscuous interface) is for this host only when its destination is
 * one of them: a bridge port sees the frames for its bridge's MAC so. The
 * others go to the stack, which drops them or bridges them on, as it does
 * for the nft plane (lb_other_host). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct host_mac_key);
	__type(value, __u32);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_host_mac SEC(".maps");

/* ifindex -> the interface's MAC, for the interfaces of the namespace whose
 * index is below XLB_MAX_IF_MAC: the XDP program, which has no pkt_type,
 * compares a frame's destination with its interface's MAC here (an array
 * lookup, inlined) before it looks the MAC up in xlb_host_mac. Written
 * with xlb_host_mac; not pinned: a new program gets its own, filled before
 * it is attached. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct if_mac);
	__uint(max_entries, XLB_MAX_IF_MAC);
} xlb_if_mac SEC(".maps");

/* Connection sync (xlb_sync.h): a struct sync_conn per new, changed and
 * ended flow of a snat or dnat farm while the daemon reads it
 * (xlb_sync_on). Not pinned: what a dead daemon's program wrote goes with
 * it, and the peers get the whole table again when the daemon returns. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, XLB_SYNC_SIZE);
} xlb_sync SEC(".maps");

/* A peer's connections for xlb_ct_install to put into xlb_ct: the loader
 * writes elements 0..n-1, runs the program, and reads each one's rc, all
 * through the map's memory mapping (a batch update's system call copied
 * each element: about a tenth of the install's CPU). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct sync_conn);
	__uint(max_entries, XLB_SYNC_BATCH);
} xlb_sync_in SEC(".maps");

/* Keeps struct conn_event in the BTF for bpf2go (-type conn_event). */
const struct conn_event *xlb_unused_conn_event __attribute__((unused));

#endif /* XLB_MAPS_H */
