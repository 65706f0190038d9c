package dataplane

// CheckSocketMark is the packet mark (SO_MARK) of the health checks' own
// sockets (internal/health). A plane whose namespace tracks connections
// (nft) leaves locally sent packets with this mark untracked: a check's
// connection then costs no conntrack entry and no pass through the NAT
// chains, which on the nft plane were a third of the checks' CPU
// (docs/health.md). The mark only ever appears on the checks' packets
// leaving the LB's namespace; a host that uses it for policy routing
// should know that.
const CheckSocketMark = 0x786c6263 // "xlbc"
