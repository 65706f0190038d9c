package nft

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/xlb-lb/xlb/internal/model"
)

// Maglev (Eisenbud et al., NSDI 2016) fills a lookup table of M slots, M
// prime, so that every backend owns about M/N slots and adding or removing
// one backend changes the owner of about M/N slots only: the flows of the
// other backends stay where they are. The table is computed here and sent
// as the farm's backend map (slot -> backend); the chain hashes the
// connection (source and destination address and port, jhash with the
// farm's seed) modulo M.
//
// Each backend is identified by its address and port, not its name, so a
// backend keeps its slots when renamed. Weights are honoured by giving a
// backend as many turns per round as its weight (relative to the smallest).

// maglevPrimes are the table sizes: the smallest one at least 100 times the
// number of the farm's configured backends (serving or not) is used (the
// paper's rule for an even spread), at most 65521 slots. Sizing by the
// configured backends keeps the size, and so every other flow, in place
// when backends go down, drain or come back; adding backends past 2, 5,
// 10, 20, 40, 81, 163 or 327 changes the size and so moves most flows
// (established connections stay: conntrack keeps them).
var maglevPrimes = []int{251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521}

func maglevSize(n int) int {
	for _, p := range maglevPrimes {
		if p >= 100*n {
			return p
		}
	}
	return maglevPrimes[len(maglevPrimes)-1]
}

// maglevKeys are the fields the maglev scheduler hashes.
func maglevKeys(f *model.Farm) model.HashKey {
	if f.Protocol == model.ProtoAll {
		return model.KeySrcIP | model.KeyDstIP
	}
	return model.KeySrcIP | model.KeyDstIP | model.KeySrcPort | model.KeyDstPort
}

// maglevTable returns, for each slot, the index in backends (the serving
// ones) of its owner; configured is the number of the farm's backends.
func maglevTable(backends []model.Backend, configured int) []int {
	n := len(backends)
	m := maglevSize(max(n, configured))
	offset := make([]uint64, n)
	skip := make([]uint64, n)
	minW := uint32(0)
	for i, b := range backends {
		// Two independent hashes of the backend's address and port.
		sum := sha256.Sum256(binary.BigEndian.AppendUint16(b.Addr.AsSlice(), b.Port))
		offset[i] = binary.BigEndian.Uint64(sum[0:8]) % uint64(m)
		skip[i] = binary.BigEndian.Uint64(sum[8:16])%uint64(m-1) + 1
		if minW == 0 || b.Weight < minW {
			minW = b.Weight
		}
	}
	turns := make([]int, n)
	for i, b := range backends {
		turns[i] = max(1, int(b.Weight/max(minW, 1)))
	}
	table := make([]int, m)
	for i := range table {
		table[i] = -1
	}
	next := make([]uint64, n)
	filled := 0
	for filled < m {
		for i := 0; i < n && filled < m; i++ {
			for t := 0; t < turns[i] && filled < m; t++ {
				c := (offset[i] + next[i]*skip[i]) % uint64(m)
				for table[c] >= 0 {
					next[i]++
					c = (offset[i] + next[i]*skip[i]) % uint64(m)
				}
				table[c] = i
				next[i]++
				filled++
			}
		}
	}
	return table
}
