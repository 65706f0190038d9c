package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/observe"
)

// RateSource gives a farm's estimated rates (observe.RateEstimator).
type RateSource interface {
	FarmRates(name string) (observe.FarmRates, error)
}

// SetRates makes GET /farms/{name}/rates and `xlb list --rate` answer
// from rs.
func (s *Server) SetRates(rs RateSource) { s.rates = rs }

// SetMetrics makes GET /metrics serve h (the key is required, as on every
// route; the daemon's --metrics-listen serves the same without one).
func (s *Server) SetMetrics(h http.Handler) { s.metrics = h }

// ConnsDeletedHeader carries how many connections a DELETE of connections
// removed.
const ConnsDeletedHeader = "X-Xlb-Connections-Deleted"

func (s *Server) getMetrics(w http.ResponseWriter, r *http.Request) error {
	if s.metrics == nil {
		return &engine.NotSupportedError{Msg: "this server has no metrics"}
	}
	s.metrics.ServeHTTP(w, r)
	return nil
}

// RatesJSON are a farm's or a backend's rates on the wire (per second,
// rounded as ipvsadm --rate shows them; every value a string).
type RatesJSON struct {
	CPS    string `json:"cps"`
	InPPS  string `json:"in-pps"`
	OutPPS string `json:"out-pps"`
	InBPS  string `json:"in-bps"`
	OutBPS string `json:"out-bps"`
}

// BackendRatesJSON are one backend's rates.
type BackendRatesJSON struct {
	Name string `json:"name"`
	RatesJSON
}

// FarmRatesJSON is the body of GET /farms/{name}/rates.
type FarmRatesJSON struct {
	Name string `json:"name"`
	RatesJSON
	Backends []BackendRatesJSON `json:"backends"`
}

func roundRate(v float64) uint64 {
	if v < 0 {
		return 0
	}
	return uint64(v + 0.5)
}

func ratesJSON(r observe.Rates) RatesJSON {
	u := func(v float64) string { return strconv.FormatUint(roundRate(v), 10) }
	return RatesJSON{CPS: u(r.CPS), InPPS: u(r.InPPS), OutPPS: u(r.OutPPS), InBPS: u(r.InBPS), OutBPS: u(r.OutBPS)}
}

func (s *Server) farmRates(name string) (observe.FarmRates, error) {
	if s.rates == nil {
		return observe.FarmRates{}, &engine.NotSupportedError{Msg: "this server estimates no rates"}
	}
	return s.rates.FarmRates(name)
}

func (s *Server) getRates(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	fr, err := s.farmRates(name)
	if err != nil {
		return err
	}
	out := FarmRatesJSON{Name: name, RatesJSON: ratesJSON(fr.Rates), Backends: []BackendRatesJSON{}}
	for _, b := range fr.Backends {
		out.Backends = append(out.Backends, BackendRatesJSON{Name: b.Name, RatesJSON: ratesJSON(b.Rates)})
	}
	body, err := json.Marshal(out)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, append(body, '\n'))
	return nil
}

func listingRates(r observe.Rates) model.ListingCounters {
	return model.ListingCounters{roundRate(r.CPS), roundRate(r.InPPS), roundRate(r.OutPPS), roundRate(r.InBPS), roundRate(r.OutBPS)}
}

// writeRateListing sends the ipvsadm -L --rate style table.
func (s *Server) writeRateListing(w http.ResponseWriter, farms []*model.Farm, numeric bool) error {
	buf := make([]byte, 0, len(model.RateListingHeader)+len(farms)*256)
	buf = append(buf, model.RateListingHeader...)
	var bes []model.ListingCounters
	for _, f := range farms {
		fr, err := s.farmRates(f.Name)
		if engine.IsNotFound(err) {
			continue // deleted meanwhile
		}
		if err != nil {
			return err
		}
		bes = bes[:0]
		for _, b := range fr.Backends {
			bes = append(bes, listingRates(b.Rates))
		}
		buf = f.AppendStatsListing(buf, numeric, listingRates(fr.Rates), bes)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(buf)))
	w.Write(buf)
	return nil
}

// ConnJSON is one tracked connection on the wire (every value a string).
type ConnJSON struct {
	Farm        string `json:"farm"`
	Protocol    string `json:"protocol"`
	State       string `json:"state"`
	Active      string `json:"active"`  // "true": an established TCP connection (IPVS's ActiveConn)
	Expires     string `json:"expires"` // seconds left without traffic
	Client      string `json:"client"`
	Virtual     string `json:"virtual"`
	Backend     string `json:"backend"` // the backend's name ("" if none has its address now)
	BackendAddr string `json:"backend-addr"`
}

// ConnsJSON is the body of GET /connections and GET /farms/{name}/connections.
type ConnsJSON struct {
	Connections []ConnJSON `json:"connections"`
}

// connFilter reads the backend and client query parameters.
func connFilter(r *http.Request) (dataplane.ConnFilter, error) {
	q := r.URL.Query()
	flt := dataplane.ConnFilter{Backend: q.Get("backend")}
	if c := q.Get("client"); c != "" {
		a, err := netip.ParseAddr(c)
		if err != nil {
			return flt, &httpError{status: http.StatusBadRequest,
				err: fmt.Errorf("query parameter \"client\" value %q: must be an IPv4 or IPv6 address", c)}
		}
		flt.Client = a
	}
	return flt, nil
}

func (s *Server) getConnections(w http.ResponseWriter, r *http.Request) error {
	return s.listConnections(w, r, r.URL.Query().Get("farm"))
}

func (s *Server) getFarmConnections(w http.ResponseWriter, r *http.Request) error {
	return s.listConnections(w, r, r.PathValue("name"))
}

func (s *Server) listConnections(w http.ResponseWriter, r *http.Request, farm string) error {
	flt, err := connFilter(r)
	if err != nil {
		return err
	}
	format := r.URL.Query().Get("format")
	if format != "" && format != "json" && format != "ipvsadm" {
		return &httpError{status: http.StatusBadRequest,
			err: fmt.Errorf("query parameter \"format\" value %q: allowed values are json, ipvsadm", format)}
	}
	cs, err := s.eng.Connections(r.Context(), farm, flt)
	if err != nil {
		return err
	}
	if format == "ipvsadm" {
		buf := appendConnListing(nil, cs)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(buf)))
		w.Write(buf)
		return nil
	}
	out := ConnsJSON{Connections: make([]ConnJSON, 0, len(cs))}
	for _, c := range cs {
		out.Connections = append(out.Connections, ConnJSON{
			Farm: c.Farm, Protocol: protoName(c.Protocol), State: c.State, Active: strconv.FormatBool(c.Active),
			Expires: strconv.Itoa(int(c.Expires / time.Second)), Client: c.Client.String(), Virtual: c.VIP.String(),
			Backend: c.BackendName, BackendAddr: c.Backend.String(),
		})
	}
	body, err := json.Marshal(out)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, append(body, '\n'))
	return nil
}

func (s *Server) deleteFarmConnections(w http.ResponseWriter, r *http.Request) error {
	flt, err := connFilter(r)
	if err != nil {
		return err
	}
	n, err := s.eng.DeleteConnections(r.Context(), r.PathValue("name"), flt)
	if err != nil {
		return err
	}
	w.Header().Set(ConnsDeletedHeader, strconv.Itoa(n))
	writeOK(w)
	return nil
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 132:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

// ConnListingHeader is the header of `ipvsadm -Lcn`'s listing.
const ConnListingHeader = "IPVS connection entries\npro expire state       source                  virtual                 destination\n"

// appendConnListing appends the connections as `ipvsadm -Lcn` lists them:
//
//	TCP 14:59  ESTABLISHED 10.100.0.2:40542        10.99.0.1:80            10.200.0.11:8080
func appendConnListing(dst []byte, cs []dataplane.Conn) []byte {
	dst = append(dst, ConnListingHeader...)
	for _, c := range cs {
		dst = append(dst, strings.ToUpper(protoName(c.Protocol))...)
		dst = append(dst, ' ')
		secs := int(c.Expires / time.Second)
		dst = append(dst, fmt.Sprintf("%02d:%02d", secs/60, secs%60)...)
		dst = append(dst, "  "...)
		dst = append(dst, fmt.Sprintf("%-11s %-23s %-23s %s\n", c.State, c.Client, c.VIP, c.Backend)...)
	}
	return dst
}

// writeConnsListing sends the ipvsadm-style listing with each backend's
// tracked connections appended ("active N inactive M": IPVS's ActiveConn
// and InActConn), counted in one walk of the connection table.
func (s *Server) writeConnsListing(w http.ResponseWriter, r *http.Request, farms []*model.Farm, numeric bool) error {
	t, ok, err := s.eng.CountConns(r.Context(), farms)
	if err != nil {
		return err
	}
	if !ok {
		return &engine.NotSupportedError{Msg: fmt.Sprintf("the %s data plane cannot count connections", s.eng.Dataplane().Name())}
	}
	buf := make([]byte, 0, len(model.ListingHeader)+len(farms)*160)
	buf = append(buf, model.ListingHeader...)
	for _, f := range farms {
		var hs []engine.BackendHealth
		if f.HasChecks() {
			hs, _ = s.eng.FarmHealth(f)
		}
		cc := t.Backends[f.Name]
		buf = f.AppendListingExtra(buf, numeric, func(i int) string {
			var c dataplane.ConnCounts
			if i < len(cc) {
				c = cc[i]
			}
			extra := " active " + strconv.FormatUint(c.Active, 10) + " inactive " + strconv.FormatUint(c.Inactive, 10)
			if hs != nil {
				extra += engine.HealthSuffix(f, hs, i)
			}
			return extra
		})
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(buf)))
	w.Write(buf)
	return nil
}
