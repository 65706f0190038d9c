package main

import (
	"encoding/json"
	"strings"

	"github.com/spf13/cobra"
)

// checkFlag is a command-line flag for one field of a "check" object.
type checkFlag struct {
	flag, field, usage string
	farmOnly           bool
}

var checkFlags = []checkFlag{
	{"check", "type", "health check: tcp, http, https, udp, exec or agent; none: a farm's removes it, a backend's is not checked; inherit (backend): the farm's check again", false},
	{"check-port", "port", "port the check connects to (default: the backend's, else the farm's virtual port)", false},
	{"check-source", "source-addr", "source address of the checks (default: the kernel's choice)", false},
	{"inter", "inter", "time between checks, e.g. 1s (default 2s)", false},
	{"fastinter", "fastinter", "time between checks while the state changes (default: inter)", false},
	{"downinter", "downinter", "time between checks while down (default: inter)", false},
	{"timeout", "timeout", "timeout of one check, e.g. 500ms (default: 1s, at most inter)", false},
	{"rise", "rise", "consecutive passes to come up (default 2)", false},
	{"fall", "fall", "consecutive failures to go down (default 3)", false},
	{"warmup", "warmup", "after coming up the weight ramps up over this long (default 0: none)", false},
	{"method", "method", "http/https check: method (default GET)", false},
	{"path", "path", "http/https check: path (default /)", false},
	{"host", "host", "http/https check: Host header and TLS server name", false},
	{"status", "status", "http/https check: expected status codes, e.g. 200-399,404 (default 200-399)", false},
	{"body-regex", "body-regex", "http/https check: the body must match this regular expression", false},
	{"body-digest", "body-digest", "http/https check: MD5 or SHA-256 of the body, in hexadecimal", false},
	{"send", "send", "tcp/udp/agent check: sent after connecting (hex:... for bytes)", false},
	{"expect", "expect", "tcp/udp check: the answer must contain it (hex:... for bytes)", false},
	{"command", "command", "exec check: command run with /bin/sh -c; exit 0 is up", false},
	{"half-open", "half-open", "tcp check: on: send a SYN and take the SYN-ACK, without completing the connection (IPv4)", false},
	{"verify", "verify", "https check: on: verify the backend's certificate (against --ca-file, else the system's roots) and name", false},
	{"ca-file", "ca-file", "https check with verify on: PEM file of the CAs to trust (absolute path)", false},
	{"init-state", "init-state", "up (default: serving until fall failures) or down (out until rise passes)", false},
	{"on-down", "on-down", "keep (default) or flush: a down backend's established connections go on or are cut", true},
	{"inhibit", "inhibit", "on or off: keepalived's inhibit_on_failure", true},
	{"quorum", "quorum", "backends that must be up; below it the sorry server serves alone (default 1)", true},
	{"hysteresis", "hysteresis", "quorum hysteresis (default 0)", true},
	{"sorry-server", "sorry-server", "name of the backend that serves only while the quorum is lost", true},
	// Passive checks: fields of the check's "passive" object.
	{"passive", "passive", "on: passive checks with the defaults (or the other --passive-* flags); off: none", true},
	{"passive-failures", "passive.failures", "passive: consecutive connection failures that eject a backend (default 5)", true},
	{"passive-timeout", "passive.timeout", "passive: a SYN without answer this long is a failure (default 1s)", true},
	{"ejection-time", "passive.ejection-time", "passive: first ejection's length; the n-th in a row lasts n times as long (default 30s)", true},
	{"max-ejection-time", "passive.max-ejection-time", "passive: the longest ejection (default 300s)", true},
	{"max-ejected", "passive.max-ejected", "passive: share of the farm's backends ejected at once, e.g. 10% (default; at least one)", true},
}

// checkFlagSet registers the check flags on cmd (the farm-only ones when
// farm) and returns a function that adds the "check" patch the flags
// given make to a JSON object body, and how many flags were given.
func checkFlagSet(cmd *cobra.Command, farm bool) func(body []byte) ([]byte, int) {
	values := make([]string, len(checkFlags))
	for i, f := range checkFlags {
		if f.farmOnly && !farm {
			continue
		}
		cmd.Flags().StringVar(&values[i], f.flag, "", f.usage)
	}
	return func(body []byte) ([]byte, int) {
		obj := map[string]any{}
		passive := map[string]string{}
		n := 0
		for i, f := range checkFlags {
			if (!f.farmOnly || farm) && cmd.Flags().Changed(f.flag) {
				n++
				if sub, ok := strings.CutPrefix(f.field, "passive."); ok {
					passive[sub] = values[i]
				} else if f.field != "passive" {
					obj[f.field] = values[i]
				}
			}
		}
		if n == 0 {
			return body, 0
		}
		if farm && cmd.Flags().Changed("passive") && values[passiveFlag] == "off" {
			obj["passive"] = nil
		} else if len(passive) > 0 || farm && cmd.Flags().Changed("passive") {
			obj["passive"] = passive
		}
		var check any = obj
		switch obj["type"] {
		case "none":
			if farm {
				check = nil // "check": null removes the farm's check
			}
		case "inherit":
			if !farm {
				check = nil // the backend takes the farm's check again
			}
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil {
			return body, n // the body is ours: always an object
		}
		m["check"], _ = json.Marshal(check)
		out, _ := json.Marshal(m)
		return out, n
	}
}

// passiveFlag is the index of --passive in checkFlags.
var passiveFlag = func() int {
	for i, f := range checkFlags {
		if f.flag == "passive" {
			return i
		}
	}
	panic("no --passive flag")
}()
