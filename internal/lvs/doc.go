// Package lvs turns an LVS director's configuration into xlb farms, so an
// LVS + keepalived pair (or plain ipvsadm rules) moves to xlb with its
// services and checks as they are: keepalived.conf's virtual servers, real
// servers and checkers (keepalived.go), and ipvsadm-save's rules
// (ipvsadm.go). What xlb cannot do as IPVS and keepalived would is refused
// with the file and line; what has no effect in xlb is noted.
// docs/lvs-import.md.
package lvs
