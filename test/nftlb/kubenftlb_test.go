package nftlb

import "testing"

// kube-nftlb (github.com/zevenet/kube-nftlb) turns each Service port into
// a farm with one address object (named like the farm) and each endpoint
// into a backend, and sends these calls (pkg/controller, pkg/parser); the
// bodies are what its types marshal to (omitempty fields left out). It
// never reads the answers, so what matters is that the same calls leave
// the same state.
func TestKubeNftlbFlow(t *testing.T) {
	nftlb, xlb := startPeers(t)
	service := `{"farms":[{"name":"web--http","mode":"snat","scheduler":"rr","sched-param":"none","helper":"none","log":"none",
		"state":"up","intra-connect":"on","persistence":"none","persist-ttl":"60","est-connlimit":"0",
		"addresses":[{"name":"web--http","family":"ipv4","ip-addr":"10.96.0.10","ports":"80","protocol":"tcp"}]}]}`
	endpoints := `{"farms":[{"name":"web--http","backends":[
		{"name":"web-7d4b9-abcde--http","ip-addr":"10.244.1.5","state":"up","port":"8080"},
		{"name":"web-7d4b9-fghij--http","ip-addr":"10.244.2.7","state":"up","port":"8080"}]}]}`
	steps := []step{
		// Endpoints may arrive before their Service (two informers).
		same("endpoints before the service", "POST", "/farms", `{"farms":[{"name":"early--dns","backends":[{"name":"dns-1--dns","ip-addr":"10.244.1.9","state":"up","port":"53"}]}]}`),
		get("/farms/early--dns"),
		same("the service after", "POST", "/farms", `{"farms":[{"name":"early--dns","mode":"snat","scheduler":"rr","sched-param":"none","helper":"none","log":"none",
			"state":"up","intra-connect":"on","persistence":"none","persist-ttl":"60","est-connlimit":"0",
			"addresses":[{"name":"early--dns","family":"ipv4","ip-addr":"10.96.0.53","ports":"53","protocol":"udp"}]}]}`),
		get("/farms/early--dns"),
		same("AddNftlbFarm", "POST", "/farms", service),
		same("endpoints", "POST", "/farms", endpoints),
		get("/farms"), get("/addresses"),
		// An endpoint goes: kube-nftlb deletes every backend path it
		// knew, then posts the new endpoints.
		same("delete backend", "DELETE", "/farms/web--http/backends/web-7d4b9-abcde--http", ""),
		same("delete backend", "DELETE", "/farms/web--http/backends/web-7d4b9-fghij--http", ""),
		same("endpoints again", "POST", "/farms", `{"farms":[{"name":"web--http","backends":[{"name":"web-7d4b9-fghij--http","ip-addr":"10.244.2.7","state":"up","port":"8080"}]}]}`),
		get("/farms/web--http"),
		// UpdateNftlbFarm: DeleteNftlbFarm (the farm, then its
		// addresses), then AddNftlbFarm.
		same("delete farm", "DELETE", "/farms/web--http", ""),
		same("delete address", "DELETE", "/addresses/web--http", ""),
		same("add again", "POST", "/farms", service),
		get("/farms"), get("/addresses"),
		// Annotations: mode, scheduler, persistence, helper, log.
		same("annotations", "POST", "/farms", `{"farms":[{"name":"web--http","mode":"dnat","scheduler":"hash","sched-param":"srcip","persistence":"srcip","persist-ttl":"60","log":"input","log-prefix":"web"}]}`),
		get("/farms/web--http"),
		// Service deleted.
		same("delete farm", "DELETE", "/farms/web--http", ""),
		same("delete address", "DELETE", "/addresses/web--http", ""),
		same("delete farm", "DELETE", "/farms/early--dns", ""),
		same("delete address", "DELETE", "/addresses/early--dns", ""),
		get("/farms"), get("/addresses"),
	}
	// A NodePort Service: kube-nftlb sends an address without ip-addr
	// (every local address); nftlb 1.0.7 refuses it (400, "Key 'ip-addr'
	// cannot be empty"), and so does xlb.
	steps = append(steps, same("NodePort address", "POST", "/farms", `{"farms":[{"name":"np--http","mode":"snat","state":"up","intra-connect":"on",
		"addresses":[{"name":"np--http--nodePort","family":"ipv4","ip-addr":"","ports":"30080","protocol":"tcp"}]}]}`),
		// nftlb keeps the farm it parsed before the error; a refused
		// request changes nothing in xlb.
		step{name: "undo nftlb's half change", method: "DELETE", path: "/farms/np--http", nftlbOnly: true},
		get("/farms"))
	// NetworkPolicies (pkg/controller/networkpolicy.go, pkg/json):
	// POST /policies of the input whitelist and blacklist (family ""
	// as its types marshal it), then POST /farms of what
	// ParseNetworkPolicyAsFarms returns, which is nil: the body "null".
	// On delete and update, DELETE /policies naming the four lists
	// (input and output, white and black) whether they exist or not.
	policies := `{"policies":[{"name":"np--input-whitelist","type":"whitelist","family":"","elements":[{"data":"10.244.0.0/16"}]},
		{"name":"np--input-blacklist","type":"blacklist","family":"","elements":[{"data":"10.244.9.0/24"}]}]}`
	names := `{"policies":[{"name":"np--input-whitelist","type":"","family":"","elements":null},{"name":"np--input-blacklist","type":"","family":"","elements":null},
		{"name":"np--output-whitelist","type":"","family":"","elements":null},{"name":"np--output-blacklist","type":"","family":"","elements":null}]}`
	// nftlb 1.0.7 reads a DELETE /policies body as a POST: it creates
	// the four named policies and turns the named whitelist into a
	// blacklist (type "" defaults); xlb deletes the named policies that
	// exist (docs/nftlb-compat.md). nftlb is then brought to that state.
	del := func(name string) []step {
		return []step{
			{name: name, method: "DELETE", path: "/policies", body: names, xlbOnly: true,
				why: "xlb deletes the policies a DELETE /policies body names; nftlb 1.0.7 posts them"},
			{name: name + " (in nftlb)", method: "DELETE", path: "/policies", nftlbOnly: true},
		}
	}
	steps = append(steps,
		same("AddNftlbPolicies", "POST", "/policies", policies),
		same("AddNftlbPolicies: the farms", "POST", "/farms", `null`),
		get("/policies"))
	steps = append(steps, del("UpdateNftlbPolicies: delete")...)
	steps = append(steps,
		same("UpdateNftlbPolicies: add", "POST", "/policies", policies),
		get("/policies"))
	steps = append(steps, del("DeleteNftlbPolicies")...)
	steps = append(steps, get("/policies"), get("/farms"))
	run(t, nftlb, xlb, steps)
}
