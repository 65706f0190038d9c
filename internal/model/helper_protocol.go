package model

import "slices"

// Handles reports whether the conntrack helper h works with protocol p
// (HelperNone with every protocol): a Kubernetes Service asks for a helper
// once for all its ports, and it applies to the ports it can handle.
func (h Helper) Handles(p Protocol) bool {
	return h == HelperNone || slices.Contains(helperProtocols[h], p)
}
