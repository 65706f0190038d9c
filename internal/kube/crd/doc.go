// Package crd makes Kubernetes custom resources xlb's configuration: every
// xlb node (xlb daemon --kube-crd) watches the cluster-scoped Farm, Table
// and Check resources of group xlb.io and programs them through its engine,
// so the API server (and etcd behind it) is what spreads one configuration
// over every node; xlb has no replication of its own.
//
// Each object is validated by the model's validators, as a REST request
// would be, and applied in a transaction of its own: an object that is
// invalid, or that the engine refuses against the others (two farms on one
// VIP and port, a policy naming a missing table, a mode the data plane
// cannot do) changes nothing in the kernel, keeps its previous generation
// programmed if it had one, and says why in its status (one entry per
// node) and in a Warning Event; it never holds back the other objects.
// With --kube-crd the resources are the node's whole configuration: farms
// and tables without a resource are removed once the informers have
// synced (never before: an API server that cannot be reached removes
// nothing).
package crd

import "k8s.io/apimachinery/pkg/runtime/schema"

//go:generate go run ./gen

// Group and Version of the custom resources.
const (
	Group   = "xlb.io"
	Version = "v1alpha1"
)

// The kinds.
const (
	KindFarm  = "Farm"
	KindTable = "Table"
	KindCheck = "Check"
)

// Resources of the kinds.
var (
	FarmResource  = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "farms"}
	TableResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "tables"}
	CheckResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "checks"}
)
