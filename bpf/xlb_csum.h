/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Header rewrites with incremental checksum updates, and the hash of the
 * hash scheduler. The kernel's csum helpers handle both CHECKSUM_PARTIAL
 * (offloaded, as from local veth senders) and complete checksums.
 */
#ifndef XLB_CSUM_H
#define XLB_CSUM_H

#include <linux/bpf.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>

#include "xlb_parsing.h"

#define XLB_IP_CSUM_OFF (sizeof(struct ethhdr) + __builtin_offsetof(struct iphdr, check))
#define XLB_IP_SRC_OFF (sizeof(struct ethhdr) + __builtin_offsetof(struct iphdr, saddr))
#define XLB_IP_DST_OFF (sizeof(struct ethhdr) + __builtin_offsetof(struct iphdr, daddr))
#define XLB_IP_TTL_OFF (sizeof(struct ethhdr) + __builtin_offsetof(struct iphdr, ttl))

/**
 * lb4_rewrite() - rewrite a packet's IPv4 tuple to the conntrack value's.
 * @skb: the packet
 * @p: its parsed tuple
 * @v: the tuple to leave with
 *
 * Updates the IPv4 header checksum and the TCP/UDP checksum (a UDP checksum
 * of zero, "none", stays zero). Return: 0, or a negative helper error.
 */
static __always_inline int lb4_rewrite(struct __sk_buff *skb, struct pkt *p, struct ct_val *v)
{
	__u32 csum_off = p->l4off;
	__u64 l4f = 0;
	__u32 n;
	__u16 port;
	int err;

	if (p->k.proto == IPPROTO_TCP) {
		csum_off += __builtin_offsetof(struct tcphdr, check);
	} else {
		csum_off += __builtin_offsetof(struct udphdr, check);
		l4f = BPF_F_MARK_MANGLED_0;
	}

	if (v->src[0] != p->k.src[0]) {
		n = v->src[0];
		err = bpf_l4_csum_replace(skb, csum_off, p->k.src[0], n, l4f | BPF_F_PSEUDO_HDR | 4);
		err = err ?: bpf_l3_csum_replace(skb, XLB_IP_CSUM_OFF, p->k.src[0], n, 4);
		err = err ?: bpf_skb_store_bytes(skb, XLB_IP_SRC_OFF, &n, 4, 0);
		if (err)
			return err;
	}
	if (v->dst[0] != p->k.dst[0]) {
		n = v->dst[0];
		err = bpf_l4_csum_replace(skb, csum_off, p->k.dst[0], n, l4f | BPF_F_PSEUDO_HDR | 4);
		err = err ?: bpf_l3_csum_replace(skb, XLB_IP_CSUM_OFF, p->k.dst[0], n, 4);
		err = err ?: bpf_skb_store_bytes(skb, XLB_IP_DST_OFF, &n, 4, 0);
		if (err)
			return err;
	}
	if (v->sport != p->k.sport) {
		port = v->sport;
		err = bpf_l4_csum_replace(skb, csum_off, p->k.sport, port, l4f | 2);
		err = err ?: bpf_skb_store_bytes(skb, p->l4off, &port, 2, 0);
		if (err)
			return err;
	}
	if (v->dport != p->k.dport) {
		port = v->dport;
		err = bpf_l4_csum_replace(skb, csum_off, p->k.dport, port, l4f | 2);
		err = err ?: bpf_skb_store_bytes(skb, p->l4off + 2, &port, 2, 0);
		if (err)
			return err;
	}
	return 0;
}

/**
 * lb4_dec_ttl() - decrement the TTL of a packet we forward ourselves.
 * Return: 0, or a negative helper error.
 */
static __always_inline int lb4_dec_ttl(struct __sk_buff *skb, struct pkt *p)
{
	__u16 nw = p->ttl_word;
	__u8 ttl = p->ttl - 1;
	int err;

	((__u8 *)&nw)[0] = ttl;
	err = bpf_l3_csum_replace(skb, XLB_IP_CSUM_OFF, p->ttl_word, nw, 2);
	return err ?: bpf_skb_store_bytes(skb, XLB_IP_TTL_OFF, &ttl, 1, 0);
}

/* jhash (Bob Jenkins' lookup3, as in the kernel's linux/jhash.h). */
#define XLB_JHASH_INITVAL 0xdeadbeef

static __always_inline __u32 xlb_rol32(__u32 w, __u32 s) { return (w << s) | (w >> (32 - s)); }

static __always_inline __u32 xlb_jhash_3words(__u32 a, __u32 b, __u32 c, __u32 initval)
{
	a += XLB_JHASH_INITVAL;
	b += XLB_JHASH_INITVAL;
	c += initval;
	c ^= b; c -= xlb_rol32(b, 14);
	a ^= c; a -= xlb_rol32(c, 11);
	b ^= a; b -= xlb_rol32(a, 25);
	c ^= b; c -= xlb_rol32(b, 16);
	a ^= c; a -= xlb_rol32(c, 4);
	b ^= a; b -= xlb_rol32(a, 14);
	c ^= b; c -= xlb_rol32(b, 24);
	return c;
}

#endif /* XLB_CSUM_H */
