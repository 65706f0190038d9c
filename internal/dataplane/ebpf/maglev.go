package ebpf

import (
	"hash/fnv"
)

// Maglev lookup table sizes (primes). A table much larger than the number
// of backends keeps the load even and the disruption of a change small
// (the Maglev paper uses M > 100 N): 4093 slots up to 40 backends, 16381
// beyond. Crossing 40 backends changes the size and so remaps most clients.
const (
	maglevSmall = 4093
	maglevLarge = 16381 // <= maxSlotsPerService
)

func maglevSize(n int) int {
	if n <= 40 {
		return maglevSmall
	}
	return maglevLarge
}

// maglevTable returns a Maglev lookup table (Eisenbud et al., NSDI 2016) of
// size m: slot -> index into names. Each backend's permutation of the slots
// comes from its name (address and port), so a backend keeps most of its
// slots when others come and go. Weights are honoured by letting a backend
// take a turn in proportion to its weight (the heaviest takes every turn).
func maglevTable(names []string, weights []uint32, m int) []int {
	n := len(names)
	if n == 0 {
		return nil
	}
	offset := make([]uint64, n)
	skip := make([]uint64, n)
	var wmax uint32
	for i, name := range names {
		offset[i] = hash64(name, 0x6d61676c) % uint64(m)
		skip[i] = hash64(name, 0x65760000)%uint64(m-1) + 1
		wmax = max(wmax, weights[i])
	}
	next := make([]uint64, n)
	credit := make([]uint64, n)
	table := make([]int, m)
	for i := range table {
		table[i] = -1
	}
	filled := 0
	for filled < m {
		for i := 0; i < n && filled < m; i++ {
			credit[i] += uint64(weights[i])
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

func hash64(s string, seed uint32) uint64 {
	h := fnv.New64a()
	var b [4]byte
	b[0], b[1], b[2], b[3] = byte(seed), byte(seed>>8), byte(seed>>16), byte(seed>>24)
	h.Write(b[:])
	h.Write([]byte(s))
	return h.Sum64()
}
