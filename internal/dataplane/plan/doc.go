// Package plan is the kernel-independent part of xlb's data planes: what a
// change is (Diff), how a family dual farm splits into one farm per family
// (Halves, SplitDiff), and how a backend is chosen for a flow where the
// choice must not depend on the kernel (Maglev, HashTable, WeightedSlots,
// FlowSlot).
//
// Both planes translate these into their kernel's objects and never compute
// them themselves, so they cannot disagree: a flow hashed on the nftables
// plane and on the eBPF plane, on this node or on another, lands on the same
// backend of the same backend set: the conformance scenarios sched-maglev,
// sched-hash-srcip, sched-hash-srcip-srcport, their -ipv6 twins and
// sched-hash-all-keys (internal/dataplane/conformance), which both planes run, send real flows through each kernel and require every one to
// reach the backend this package's model names, before and after a backend
// goes down.
//
// The package imports only the model: the store, the engine and both planes
// may depend on it.
package plan
