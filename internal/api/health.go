package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/events"
	"github.com/xlb-lb/xlb/internal/health"
	"github.com/xlb-lb/xlb/internal/model"
)

// CheckStatus gives the last check of a checked backend: the health
// monitor.
type CheckStatus interface {
	Status(farm, backend string) (health.Status, bool)
}

// SetChecks makes GET /farms/{name} show each checked backend's last
// check from c.
func (s *Server) SetChecks(c CheckStatus) { s.checks = c }

// PassiveStatus gives the passive check state of a watched backend: the
// ejector.
type PassiveStatus interface {
	PassiveStatus(farm, backend string) (health.PassiveStatus, bool)
}

// SetPassive makes GET /farms/{name} show each watched backend's passive
// check counts from p.
func (s *Server) SetPassive(p PassiveStatus) { s.passive = p }

// SetEvents makes GET /events stream the events of b.
func (s *Server) SetEvents(b *events.Broker) { s.events = b }

// writeFarm sends one farm as GET /farms/{name} shows it: the
// configuration, and for each backend its health (up, down or unchecked),
// the weight the data plane has, and its last check. Those members are
// read-only: a PUT of the same body ignores them. A farm without checks
// is shown exactly as GET /farms dumps it (nftlb's form).
func (s *Server) writeFarm(w http.ResponseWriter, f *model.Farm) {
	if !f.HasChecks() {
		writeFarms(w, []*model.Farm{f})
		return
	}
	hs, _ := s.eng.FarmHealth(f)
	buf := make([]byte, 0, f.JSONLen()+len(f.Backends)*160+16)
	buf = append(buf, `{"farms":[`...)
	buf = f.AppendJSONExtra(buf, func(dst []byte, i int) []byte {
		h := hs[i]
		dst = append(dst, `,"health":`...)
		dst = strconv.AppendQuote(dst, h.State)
		dst = append(dst, `,"effective-weight":"`...)
		dst = strconv.AppendUint(dst, uint64(h.Weight), 10)
		dst = append(dst, '"')
		if h.Watched {
			dst = s.appendPassive(dst, f.Name, f.Backends[i].Name, h)
		}
		if h.State == engine.HealthUnchecked || s.checks == nil {
			return dst
		}
		st, ok := s.checks.Status(f.Name, f.Backends[i].Name)
		if !ok {
			return dst
		}
		dst = append(dst, `,"last-check":{`...)
		if st.Checked {
			result := "pass"
			if !st.Last.OK {
				result = "fail"
			}
			dst = append(dst, `"result":"`...)
			dst = append(dst, result...)
			dst = append(dst, `","reason":`...)
			dst = strconv.AppendQuote(dst, st.Last.Detail)
			dst = append(dst, `,"time":"`...)
			dst = st.Last.Start.UTC().AppendFormat(dst, time.RFC3339Nano)
			dst = append(dst, `","duration":"`...)
			dst = append(dst, st.Last.Took.Round(time.Microsecond).String()...)
			dst = append(dst, `",`...)
		} else {
			dst = append(dst, `"result":"none",`...)
		}
		for _, kv := range []struct {
			k string
			v uint64
		}{{"checks", st.Checks}, {"failures", st.Fails}, {"streak", uint64(st.Streak)}, {"downs", h.Downs}, {"ups", h.Ups}} {
			dst = append(dst, '"')
			dst = append(dst, kv.k...)
			dst = append(dst, `":"`...)
			dst = strconv.AppendUint(dst, kv.v, 10)
			dst = append(dst, `",`...)
		}
		dst = append(dst, `"since":"`...)
		if !h.Since.IsZero() {
			dst = h.Since.UTC().AppendFormat(dst, time.RFC3339Nano)
		}
		dst = append(dst, '"')
		if h.Reason != "" {
			dst = append(dst, `,"transition-reason":`...)
			dst = strconv.AppendQuote(dst, h.Reason)
		}
		return append(dst, '}')
	})
	buf = append(buf, "]}\n"...)
	writeJSON(w, http.StatusOK, buf)
}

// appendPassive appends a watched backend's "passive-check" member: whether
// it is ejected (why, since when, until when), its ejections, and what the
// data plane counted of its handshakes.
func (s *Server) appendPassive(dst []byte, farm, backend string, h engine.BackendHealth) []byte {
	dst = append(dst, `,"passive-check":{"ejected":"`...)
	if h.Ejected {
		dst = append(dst, `yes","reason":`...)
		dst = strconv.AppendQuote(dst, h.EjectReason)
		dst = append(dst, `,"since":"`...)
		dst = h.EjectedSince.UTC().AppendFormat(dst, time.RFC3339Nano)
		dst = append(dst, '"')
	} else {
		dst = append(dst, `no"`...)
	}
	kv := []struct {
		k string
		v uint64
	}{{"ejections", h.Ejections}}
	if s.passive != nil {
		if st, ok := s.passive.PassiveStatus(farm, backend); ok {
			if st.Ejected {
				dst = append(dst, `,"until":"`...)
				dst = st.Until.UTC().AppendFormat(dst, time.RFC3339Nano)
				dst = append(dst, '"')
			}
			c := st.Count
			kv = append(kv, []struct {
				k string
				v uint64
			}{{"ejections-in-a-row", uint64(st.InARow)}, {"consecutive-failures", uint64(c.Consecutive)}, {"successes", c.Successes},
				{"resets", c.Resets}, {"timeouts", c.Timeouts}, {"unreachable", c.Unreachable}, {"slow", c.Slow}}...)
		}
	}
	for _, x := range kv {
		dst = append(dst, `,"`...)
		dst = append(dst, x.k...)
		dst = append(dst, `":"`...)
		dst = strconv.AppendUint(dst, x.v, 10)
		dst = append(dst, '"')
	}
	return append(dst, '}')
}

// appendListing appends a farm's lines of the ipvsadm-style table, with
// the health of checked backends at the end of their lines.
func (s *Server) appendListing(buf []byte, f *model.Farm, numeric bool) []byte {
	if !f.HasChecks() {
		return f.AppendListing(buf, numeric)
	}
	hs, _ := s.eng.FarmHealth(f)
	return f.AppendListingExtra(buf, numeric, func(i int) string { return engine.HealthSuffix(f, hs, i) })
}
