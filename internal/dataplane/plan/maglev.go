package plan

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/xlb-lb/xlb/internal/model"
)

// Maglev (Eisenbud et al., "Maglev: A Fast and Reliable Software Network
// Load Balancer", NSDI 2016, section 3.4) fills a lookup table of M slots,
// M prime, so that every backend owns about M/N slots and a change of the
// backend set changes the owner of few slots beyond those of the backends
// that came or went. A flow goes to the owner of slot FlowSlot(MaglevKeys,
// flow, M). This file is the only Maglev in xlb: both planes send the
// table Maglev returns to their kernel as it is.
//
// The choices, and why:
//   - Size (MaglevSize): the smallest prime of maglevPrimes at least 100
//     times the farm's configured backends, serving or not. The paper asks
//     for M > 100 N for an even spread (each backend's share is M/N within
//     one slot, so within 1 % at M >= 100 N). Sizing by the configured
//     count, not the serving one, keeps M, and so every other flow, in
//     place when backends go down, drain or come back; only adding
//     backends past 2, 5, 10, 20, 40, 81, 163 or 327 changes M (and then
//     most flows move; established connections stay, conntrack keeps
//     them). At most 65521 slots: farms past 655 backends are spread
//     less evenly.
//   - Permutation: a backend's offset and skip come from SHA-256 of its
//     address and port (16 bytes for IPv6, 4 for IPv4, then the port in
//     network order): its identity on the wire, the same on every node
//     whatever the backend is called there, and kept when it is renamed.
//   - Weights: each round a backend earns its weight in credit and takes
//     a turn (the next free slot of its permutation) each time its credit
//     reaches the largest weight, so shares follow the weights' ratios
//     (2:3 gets 2:3). With equal weights this is the paper's round robin.

// maglevPrimes are the table sizes (see MaglevSize).
var maglevPrimes = []int{251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521}

// MaglevMaxSize is the largest Maglev table.
const MaglevMaxSize = 65521

// MaglevSize is the table size of a farm with configured backends.
func MaglevSize(configured int) int {
	for _, p := range maglevPrimes {
		if p >= 100*configured {
			return p
		}
	}
	return MaglevMaxSize
}

// MaglevKeys are the flow fields the maglev scheduler hashes: both
// addresses and both ports (addresses only for protocol all, whose packets
// may have no ports).
func MaglevKeys(f *model.Farm) model.HashKey {
	if f.Protocol == model.ProtoAll {
		return model.KeySrcIP | model.KeyDstIP
	}
	return model.KeySrcIP | model.KeyDstIP | model.KeySrcPort | model.KeyDstPort
}

// MaglevTable returns the farm's Maglev table over its serving backends
// (model.Farm.ActiveBackends, which the caller passes as active): for each
// slot the index in active of its owner. Nil when no backend serves.
func MaglevTable(f *model.Farm, active []model.Backend) []int {
	return Maglev(active, MaglevSize(len(f.Backends)))
}

// Maglev returns a Maglev table of m slots (m prime) over backends: for
// each slot the index of its owner. Nil without backends.
func Maglev(backends []model.Backend, m int) []int {
	n := len(backends)
	if n == 0 {
		return nil
	}
	// Backends take their turns in the order of their identity, not of
	// the list: the same set gives the same table whatever order a node
	// lists it in (EndpointSlices, API clients).
	order := identityOrder(backends)
	offset := make([]uint64, n)
	skip := make([]uint64, n)
	var wmax uint32
	for i, b := range backends {
		offset[i], skip[i] = maglevPermutation(b, m)
		wmax = max(wmax, b.Weight)
	}
	wmax = max(wmax, 1)
	next := make([]uint64, n)
	credit := make([]uint64, n)
	table := make([]int, m)
	for i := range table {
		table[i] = -1
	}
	filled := 0
	for filled < m {
		for _, i := range order {
			if filled == m {
				break
			}
			credit[i] += uint64(max(backends[i].Weight, 1))
			if credit[i] < uint64(wmax) {
				continue
			}
			credit[i] -= uint64(wmax)
			for {
				c := (offset[i] + next[i]*skip[i]) % uint64(m)
				next[i]++
				if table[c] < 0 {
					table[c] = i
					filled++
					break
				}
			}
		}
	}
	return table
}

// maglevPermutation returns backend b's offset and skip in a table of m
// slots: two independent 64-bit parts of SHA-256 of its address and port.
func maglevPermutation(b model.Backend, m int) (offset, skip uint64) {
	var buf [18]byte
	id := binary.BigEndian.AppendUint16(append(buf[:0], b.Addr.AsSlice()...), b.Port)
	sum := sha256.Sum256(id)
	offset = binary.BigEndian.Uint64(sum[0:8]) % uint64(m)
	skip = binary.BigEndian.Uint64(sum[8:16])%uint64(m-1) + 1
	return offset, skip
}
