package model

import (
	"fmt"
	"net/netip"
	"unicode"
	"unicode/utf8"
)

// Free text (log-prefix) is checked as the kernel and the store will see
// it: the kernel takes the bytes as they are and counts bytes, the store
// writes JSON, where invalid UTF-8 would become U+FFFD (three bytes for
// each bad byte). A value that is valid UTF-8 without control characters
// is the same bytes in the kernel, in the API's answers and on disk, so a
// farm that was accepted once is accepted again when the daemon loads it.

// textProblem returns what is wrong with s as free text of at most max
// bytes, or "" if nothing is.
func textProblem(s string, max int) string {
	if !utf8.ValidString(s) {
		return "must be valid UTF-8 text"
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return "must not hold control characters (tabs, line breaks, NUL...)"
		}
	}
	if len(s) > max {
		return fmt.Sprintf("at most %d bytes (UTF-8; this value has %d)", max, len(s))
	}
	return ""
}

// maxQuoted bounds how much of a bad value an error quotes: a 10 MB value
// is not echoed back whole.
const maxQuoted = 64

// clip cuts s to maxQuoted bytes for an error message, at a character
// boundary, and says how long it was. A value a little longer than
// maxQuoted is left whole, so clipping a clipped value changes nothing.
func clip(s string) string {
	if len(s) <= maxQuoted+24 {
		return s
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:cut], len(s))
}

// Clip is clip for other packages' error messages (query parameters,
// names from a URL).
func Clip(s string) string { return clip(s) }

// addrProblem returns why a cannot be a farm's VIP (vip) or a backend's or
// source address, or "" if it can. Unspecified, broadcast and multicast
// addresses name no one host: the kernel would take them, and the farm
// would never carry a connection.
func addrProblem(a netip.Addr, vip bool) string {
	switch {
	case a.IsUnspecified():
		return "must not be the unspecified address (0.0.0.0 or ::)"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "must not be the broadcast address"
	case a.IsMulticast():
		if vip {
			return "must be a unicast address (multicast VIPs are not balanced)"
		}
		return "must be a unicast address"
	}
	return ""
}
