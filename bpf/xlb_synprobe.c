//go:build ignore

/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The half-open checks' receive side (internal/health/synbypass.go): a tcx
 * ingress program, first on the interface, that takes the answers to the
 * checks' SYNs before the IP stack sees them. A segment to one of the
 * checks' source ports (xlb_syn_ports) that is a SYN-ACK or a RST is put
 * in the ring buffer xlb_syn_replies for the checker, which matches it to
 * its check (the acknowledgement number against the check's cookie, the
 * source against the check's backend) in batches. The SYN-ACK is turned
 * into the RST the LB's TCP would have sent (sequence number = its
 * acknowledgement number) and sent back out of the interface, so the
 * backend frees its half-open connection; a RST is dropped. Anything else
 * goes on (the next program, the stack).
 *
 * Why tcx and not XDP: the eBPF plane's programs on the same interface are
 * tcx (and optionally XDP); tcx programs of several owners run in order on
 * one interface, XDP takes one. A generic-mode XDP program (bridges,
 * veths without a peer program) would also copy every data-plane packet
 * of the interface into a linear buffer. The stack is bypassed all the
 * same: the answer never reaches IP.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define SYN_NEXT -1    /* TCX_NEXT */
#define SYN_DROP 2     /* TCX_DROP */
#define SYN_REDIRECT 7 /* TCX_REDIRECT */

/* One answer, as the checker reads it (struct synReply in Go). Addresses,
 * ports and the acknowledgement number in network order. */
struct syn_reply {
	__u64 ts; /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u32 saddr;
	__u32 ack;
	__u16 sport;
	__u16 dport;
	__u8 flags;
	__u8 pad[3];
};

/* For bpf2go: the type in the object's BTF. */
const struct syn_reply *syn_reply_unused __attribute__((unused));

/* The checks' source ports (network order). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u16);
	__type(value, __u8);
	__uint(max_entries, 64);
} xlb_syn_ports SEC(".maps");

/* 1 MiB: 43,000 answers between two reads of the checker. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} xlb_syn_replies SEC(".maps");

/* Counters: answers taken, answers lost (ring full), RSTs sent. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 3);
} xlb_syn_stats SEC(".maps");

static __always_inline void syn_count(__u32 k)
{
	__u64 *v = bpf_map_lookup_elem(&xlb_syn_stats, &k);

	if (v)
		*v += 1;
}

SEC("tcx/ingress")
int xlb_syn_rx(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct tcphdr *th = (void *)(ip + 1);
	struct syn_reply *r;
	__u32 seq, ack, addr;
	__u16 port, fw_old, fw_new, win;
	__u8 flags, mac[ETH_ALEN];

	/* IPv4 without options (a SYN-ACK to our SYN carries none), TCP. */
	if ((void *)(th + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5 ||
	    ip->protocol != IPPROTO_TCP || (ip->frag_off & bpf_htons(0x3fff)))
		return SYN_NEXT;
	port = th->dest;
	if (!bpf_map_lookup_elem(&xlb_syn_ports, &port))
		return SYN_NEXT;
	flags = ((__u8 *)th)[13];
	if (!(flags & 0x04) && (flags & 0x12) != 0x12)
		return SYN_NEXT; /* neither RST nor SYN-ACK */

	r = bpf_ringbuf_reserve(&xlb_syn_replies, sizeof(*r), 0);
	if (r) {
		r->ts = bpf_ktime_get_ns();
		r->saddr = ip->saddr;
		r->ack = th->ack_seq;
		r->sport = th->source;
		r->dport = th->dest;
		r->flags = flags;
		/* The checker polls the ring: no wake-up per answer. */
		bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
		syn_count(0);
	} else {
		syn_count(1);
	}
	if (flags & 0x04)
		return SYN_DROP;

	/* SYN-ACK -> RST: back to where it came from, seq = its ack, no ACK,
	 * window 0. Swapping addresses and ports leaves both checksums as
	 * they are; the TCP checksum takes the other words' changes (the
	 * helper knows the skb's checksum state). Options stay: a SYN-ACK to
	 * our SYN has only an MSS, which a RST's receiver ignores. */
	seq = th->seq;
	ack = th->ack_seq;
	fw_old = ((__u16 *)th)[6];
	fw_new = bpf_htons((bpf_ntohs(fw_old) & 0xff00) | 0x04);
	win = th->window;
	__builtin_memcpy(mac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, mac, ETH_ALEN);
	addr = ip->saddr;
	ip->saddr = ip->daddr;
	ip->daddr = addr;
	port = th->source;
	th->source = th->dest;
	th->dest = port;
	th->seq = ack;
	th->ack_seq = 0;
	((__u16 *)th)[6] = fw_new;
	th->window = 0;

	__u32 csum = sizeof(struct ethhdr) + sizeof(struct iphdr) +
		     __builtin_offsetof(struct tcphdr, check);
	if (bpf_l4_csum_replace(skb, csum, seq, ack, 4) ||
	    bpf_l4_csum_replace(skb, csum, ack, 0, 4) ||
	    bpf_l4_csum_replace(skb, csum, fw_old, fw_new, 2) ||
	    bpf_l4_csum_replace(skb, csum, win, 0, 2))
		return SYN_DROP;
	syn_count(2);
	return bpf_redirect(skb->ifindex, 0);
}

char _license[] SEC("license") = "Dual BSD/GPL";
