package nft

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/xlb-lb/xlb/internal/model"
)

// Conntrack helpers follow a protocol's control connection and let its
// data connections in (and, with NAT, rewrite the addresses the protocol
// carries: nf_nat_ftp, nf_nat_sip, ...). A farm with a helper has a ct
// helper object of its own, h-<hash>-<helper>-<proto>, assigned to the
// farm's new connections in its filter chain (prerouting, after conntrack,
// before NAT): `ct helper set "h-..."`. The object's name says everything
// about it, so a farm that changes helper or protocol gets a new object
// and the old one is deleted in the same batch.
//
// Helpers are assigned at prerouting only: connections a local process
// opens to the VIP get none.

// kernelHelper is the kernel's name of a helper for a protocol (H.323 is
// two kernel helpers: Q.931 over TCP and RAS over UDP).
func kernelHelper(h model.Helper, p model.Protocol) string {
	if h == model.HelperH323 {
		if p == model.ProtoUDP {
			return "RAS"
		}
		return "Q.931"
	}
	return h.String()
}

func helperObjName(f *model.Farm) string {
	return fmt.Sprintf("h-%s-%s-%s", nameHash(f.Name), f.Helper, f.Protocol)
}

func helperObj(t *nftables.Table, f *model.Farm, name string) *nftables.NamedObj {
	return &nftables.NamedObj{Table: t, Name: name, Type: nftables.ObjTypeCtHelper,
		Obj: &expr.CtHelper{Name: kernelHelper(f.Helper, f.Protocol), L4Proto: f.Protocol.Number()}}
}
