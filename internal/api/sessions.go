package api

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// SessionJSON is one persistence session on the wire (nftlb style: every
// value a string).
type SessionJSON struct {
	Client  string `json:"client"`
	Backend string `json:"backend"`
	Expires string `json:"expires,omitempty"` // seconds left; none for a static session
}

// SessionsJSON is the body of GET /farms/{name}/sessions.
type SessionsJSON struct {
	Sessions []SessionJSON `json:"sessions"`
}

func (s *Server) getSessions(w http.ResponseWriter, r *http.Request) error {
	ss, err := s.eng.Sessions(r.Context(), r.PathValue("name"))
	if err != nil {
		return failed(textInvalidRequest, err)
	}
	return writeSessions(w, ss)
}

func (s *Server) deleteClientSessions(w http.ResponseWriter, r *http.Request) error {
	n, err := s.eng.DeleteSessions(r.Context(), r.PathValue("name"), r.PathValue("client"), "")
	if err != nil {
		return failed(textDeleteSession, err)
	}
	w.Header().Set(SessionsDeletedHeader, strconv.Itoa(n))
	writeOK(w)
	return nil
}

func (s *Server) deleteBackendSessions(w http.ResponseWriter, r *http.Request) error {
	n, err := s.eng.DeleteSessions(r.Context(), r.PathValue("name"), "", r.PathValue("backend"))
	if err != nil {
		return failed(textDeleteSession, err)
	}
	w.Header().Set(SessionsDeletedHeader, strconv.Itoa(n))
	writeOK(w)
	return nil
}

func writeSessions(w http.ResponseWriter, ss []dataplane.Session) error {
	out := SessionsJSON{Sessions: make([]SessionJSON, 0, len(ss))}
	for _, x := range ss {
		s := SessionJSON{Client: x.Client, Backend: x.Backend}
		if !x.Static {
			s.Expires = strconv.Itoa(int(x.Expires.Seconds()))
		}
		out.Sessions = append(out.Sessions, s)
	}
	body, err := json.Marshal(out)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, append(body, '\n'))
	return nil
}
