/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing: Ethernet + IPv4 (with options) + TCP/UDP ports. */
#ifndef XLB_PARSING_H
#define XLB_PARSING_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>

#include "xlb_consts.h"
#include "xlb_structs.h"

#define XLB_IP_MF 0x2000
#define XLB_IP_OFFSET 0x1fff

#define XLB_TCP_FIN 0x01
#define XLB_TCP_SYN 0x02
#define XLB_TCP_RST 0x04
#define XLB_TCP_ACK 0x10

/* ICMP header (linux/icmp.h drags in libc headers). */
struct xlb_icmphdr {
	__u8 type;
	__u8 code;
	__u16 checksum; /* net */
	__u32 rest;	/* type-specific (e.g. next-hop MTU) */
};

#define XLB_ICMP_DEST_UNREACH 3
#define XLB_ICMP_FRAG_NEEDED 4 /* code of XLB_ICMP_DEST_UNREACH */
#define XLB_ICMP_TIME_EXCEEDED 11

/* IPv6 header (linux/ipv6.h drags in libc headers). */
struct xlb_ipv6hdr {
	__u8 vtc;	/* version (4 bits), traffic class (high 4 bits) */
	__u8 tc_flow;	/* traffic class (low 4 bits), flow label */
	__u16 flow_lbl; /* flow label */
	__u16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u32 saddr[4];
	__u32 daddr[4];
};

#define XLB_NEXTHDR_FRAGMENT 44
#define XLB_NEXTHDR_ICMPV6 58

#define XLB_ICMPV6_DEST_UNREACH 1
#define XLB_ICMPV6_PKT_TOOBIG 2
#define XLB_ICMPV6_TIME_EXCEED 3

static __always_inline int addr_eq(const __u32 *a, const __u32 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

/* addr_fold() - an address folded to 32 bits for hashing (an IPv4 address
 * is itself). */
static __always_inline __u32 addr_fold(const __u32 *a) { return a[0] ^ a[1] ^ a[2] ^ a[3]; }

/* What the program needs from a packet. */
struct pkt {
	struct ct_key k; /* tuple as it arrived */
	__u32 l4off;	 /* offset of the TCP/UDP header from skb->data */
	__u16 ttl_word;	 /* raw (memory order) 16 bits holding TTL and protocol */
	__u8 ttl;	 /* IPv4 TTL or IPv6 hop limit */
	__u8 tcp_flags;
};

enum xlb_parse {
	XLB_PARSE_OK = 0,
	XLB_PARSE_NOT_OURS, /* not TCP/UDP over IPv4 or IPv6, truncated or malformed */
	XLB_PARSE_FRAGMENT, /* an IPv4 fragment */
	XLB_PARSE_ICMP,	    /* an ICMP message (p->l4off, p->ttl*, addresses set) */
};

/* lb_ports() - read the TCP/UDP ports (and TCP flags) at p->l4off of the
 * packet data .. end. */
static __always_inline int lb_ports(void *data, void *end, struct pkt *p)
{
	__u32 l4off = p->l4off & 0x7f;

	if (p->k.proto == IPPROTO_TCP) {
		struct tcphdr *th = data + l4off;

		if ((void *)(th + 1) > end)
			return XLB_PARSE_NOT_OURS;
		p->k.sport = th->source;
		p->k.dport = th->dest;
		p->tcp_flags = ((__u8 *)th)[13];
	} else {
		struct udphdr *uh = data + l4off;

		if ((void *)(uh + 1) > end)
			return XLB_PARSE_NOT_OURS;
		p->k.sport = uh->source;
		p->k.dport = uh->dest;
	}
	return XLB_PARSE_OK;
}

/**
 * lb6_parse() - parse an Ethernet IPv6 TCP/UDP packet (no extension
 * headers: those, and ICMPv6, are not ours; a fragment header is a
 * fragment).
 */
static __always_inline int lb6_parse(void *data, void *end, struct pkt *p)
{
	struct xlb_ipv6hdr *ip6 = data + sizeof(struct ethhdr);

	if ((void *)(ip6 + 1) > end)
		return XLB_PARSE_NOT_OURS;
	if ((ip6->vtc >> 4) != 6)
		return XLB_PARSE_NOT_OURS;
	if (ip6->nexthdr == XLB_NEXTHDR_FRAGMENT)
		return XLB_PARSE_FRAGMENT;
	if (ip6->nexthdr != IPPROTO_TCP && ip6->nexthdr != IPPROTO_UDP &&
	    ip6->nexthdr != XLB_NEXTHDR_ICMPV6)
		return XLB_PARSE_NOT_OURS;
	p->k.family = XLB_AF_INET6;
	p->k.proto = ip6->nexthdr;
	__builtin_memcpy(p->k.src, ip6->saddr, 16);
	__builtin_memcpy(p->k.dst, ip6->daddr, 16);
	p->ttl = ip6->hop_limit;
	p->l4off = sizeof(struct ethhdr) + sizeof(struct xlb_ipv6hdr);
	if (ip6->nexthdr == XLB_NEXTHDR_ICMPV6)
		return XLB_PARSE_ICMP;
	return lb_ports(data, end, p);
}

/**
 * lb_parse_data() - parse an Ethernet IPv4 or IPv6 TCP/UDP packet.
 * @data: its first byte (skb->data, xdp_md->data)
 * @end: past its last byte
 * @p: filled on XLB_PARSE_OK
 *
 * Return: XLB_PARSE_OK, XLB_PARSE_NOT_OURS for anything else (other
 * protocols, truncated headers, IHL < 5, total length shorter than the
 * header), XLB_PARSE_FRAGMENT for any fragment (first or later),
 * XLB_PARSE_ICMP for an unfragmented ICMP or ICMPv6 message (only its IP
 * header is parsed: p->k.family/src/dst, p->ttl, p->ttl_word (IPv4) and
 * p->l4off are set).
 */
static __always_inline int lb_parse_data(void *data, void *end, struct pkt *p)
{
	struct ethhdr *eth = data;
	struct iphdr *ip;
	__u32 ihl;

	if ((void *)(eth + 1) > end)
		return XLB_PARSE_NOT_OURS;
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return lb6_parse(data, end, p);
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return XLB_PARSE_NOT_OURS;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end)
		return XLB_PARSE_NOT_OURS;
	if (ip->version != 4 || ip->ihl < 5)
		return XLB_PARSE_NOT_OURS;
	ihl = ip->ihl * 4;
	if (bpf_ntohs(ip->tot_len) < ihl)
		return XLB_PARSE_NOT_OURS;
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP &&
	    ip->protocol != IPPROTO_ICMP)
		return XLB_PARSE_NOT_OURS;
	if (ip->frag_off & bpf_htons(XLB_IP_MF | XLB_IP_OFFSET))
		return XLB_PARSE_FRAGMENT;

	p->k.family = XLB_AF_INET;
	p->k.proto = ip->protocol;
	p->k.src[0] = ip->saddr;
	p->k.dst[0] = ip->daddr;
	p->ttl = ip->ttl;
	p->ttl_word = *(__u16 *)&ip->ttl;
	p->l4off = sizeof(struct ethhdr) + ihl;
	if (ip->protocol == IPPROTO_ICMP)
		return XLB_PARSE_ICMP;

	return lb_ports(data, end, p);
}

/* lb_parse() - lb_parse_data() of an skb. */
static __always_inline int lb_parse(struct __sk_buff *skb, struct pkt *p)
{
	return lb_parse_data((void *)(long)skb->data, (void *)(long)skb->data_end, p);
}

#endif /* XLB_PARSING_H */
