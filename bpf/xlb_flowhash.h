/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The hash scheduler's flow hash (plan.FlowSlot in Go, with the farm's
 * sched-param keys), the same as the nftables plane's `jhash <keys> mod N
 * seed XLB_HASH_SEED`, so both planes and every node send a flow to the same
 * slot of the same weighted slot table (plan.HashTable).
 */
#ifndef XLB_FLOWHASH_H
#define XLB_FLOWHASH_H

#include <linux/bpf.h>

#include "xlb_consts.h"
#include "xlb_structs.h"
#include "xlb_csum.h"

/**
 * xlb_flow_hash_keys() - the kernel's jhash(key, len, XLB_HASH_SEED) over the
 * fields of @keys, in the order source address, destination address, source
 * port, destination port, each padded to 4 bytes (an address its 4 or 16
 * bytes, a port its two bytes in network order and two zero bytes): what nft
 * loads into its registers for `jhash ip saddr . th sport`. xlb_flow_hash is
 * this with every key, unrolled for maglev. Little-endian only.
 * @k: the packet's tuple.
 * @keys: XLB_HASH_* (at least one).
 * Return: the 32-bit hash.
 */
static __always_inline __u32 xlb_flow_hash_keys(const struct ct_key *k, __u8 keys)
{
	/* The key as words, zero past its end: jhash's tail adds nothing
	 * for bytes past the length, which is adding zero. */
	__u32 w[12] = {};
	__u32 n = 0, a, b, c;
	int v6 = k->family != XLB_AF_INET;

	if (keys & XLB_HASH_SRCIP) {
		w[0] = k->src[0];
		n = 1;
		if (v6) {
			w[1] = k->src[1];
			w[2] = k->src[2];
			w[3] = k->src[3];
			n = 4;
		}
	}
	if (keys & XLB_HASH_DSTIP) {
		w[n] = k->dst[0];
		if (v6) {
			w[n + 1] = k->dst[1];
			w[n + 2] = k->dst[2];
			w[n + 3] = k->dst[3];
			n += 3;
		}
		n++;
	}
	if (keys & XLB_HASH_SRCPORT)
		w[n++] = k->sport;
	if (keys & XLB_HASH_DSTPORT)
		w[n++] = k->dport;
	/* jhash: 12-byte blocks while more than 12 bytes are left, then the
	 * last 1-3 words. n is 1 to 10. */
	a = b = c = XLB_JHASH_INITVAL + (n << 2) + XLB_HASH_SEED;
	if (n > 3) {
		a += w[0];
		b += w[1];
		c += w[2];
		XLB_JHASH_MIX(a, b, c);
		if (n > 6) {
			a += w[3];
			b += w[4];
			c += w[5];
			XLB_JHASH_MIX(a, b, c);
			if (n > 9) {
				a += w[6];
				b += w[7];
				c += w[8];
				XLB_JHASH_MIX(a, b, c);
				a += w[9];
			} else {
				a += w[6];
				b += w[7];
				c += w[8];
			}
		} else {
			a += w[3];
			b += w[4];
			c += w[5];
		}
	} else {
		a += w[0];
		b += w[1];
		c += w[2];
	}
	XLB_JHASH_FINAL(a, b, c);
	return c;
}

#endif /* XLB_FLOWHASH_H */
