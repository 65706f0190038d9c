package ebpf

import (
	"errors"
)

// svcIDs allocates generation ids (indexes of xlb_rr, 1..maxSvcIDs-1).
type svcIDs struct {
	used map[uint32]bool
	next uint32
}

func (a *svcIDs) init() { a.used = map[uint32]bool{}; a.next = 1 }

func (a *svcIDs) allocSvc() (uint32, error) {
	for range maxSvcIDs {
		id := a.next
		a.next++
		if a.next >= maxSvcIDs {
			a.next = 1
		}
		if !a.used[id] {
			a.used[id] = true
			return id, nil
		}
	}
	return 0, errors.New("out of service generation ids")
}

// backendIDs allocates backend ids (keys of xlb_backends, never 0). An id
// is shared by the generations of a farm that hold the same backend: usedBE
// counts them.
type backendIDs struct {
	usedBE map[uint32]int
	nextBE uint32
}

func (a *backendIDs) init() { a.usedBE = map[uint32]int{}; a.nextBE = 1 }

// unrefBackend drops one reference to id; true when it was the last.
func (a *backendIDs) unrefBackend(id uint32) bool {
	a.usedBE[id]--
	if a.usedBE[id] > 0 {
		return false
	}
	delete(a.usedBE, id)
	return true
}

func (a *backendIDs) allocBackend() (uint32, error) {
	if len(a.usedBE) >= int(maxBackends)-1 { // ids 1 .. maxBackends-1
		return 0, errors.New("out of backend ids")
	}
	for {
		id := a.nextBE
		a.nextBE++
		if a.nextBE >= maxBackends { // ids index xlb_be_flags
			a.nextBE = 1
		}
		if a.usedBE[id] == 0 {
			a.usedBE[id] = 1
			return id, nil
		}
	}
}
