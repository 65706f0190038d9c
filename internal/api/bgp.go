package api

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/xlb-lb/xlb/internal/cluster/bgp"
	"github.com/xlb-lb/xlb/internal/cluster/connsync"
	"github.com/xlb-lb/xlb/internal/engine"
)

// BGPStatus gives the BGP speaker's sessions and announced routes: the
// announcer of internal/cluster/bgp.
type BGPStatus interface {
	Status(ctx context.Context) (bgp.Status, error)
}

// SyncStatus gives connection sync's peers and counters: the node of
// internal/cluster/connsync.
type SyncStatus interface {
	Status() connsync.Status
}

// SetSync makes GET /sync show n's peers and counters.
func (s *Server) SetSync(n SyncStatus) { s.sync = n }

func (s *Server) getSync(w http.ResponseWriter, r *http.Request) error {
	if s.sync == nil {
		return &engine.NotSupportedError{Msg: "this daemon runs no connection sync (start it with --sync-listen)"}
	}
	body, err := json.Marshal(s.sync.Status())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, append(body, '\n'))
	return nil
}

// SetBGP makes GET /bgp show b's sessions and routes.
func (s *Server) SetBGP(b BGPStatus) { s.bgp = b }

func (s *Server) getBGP(w http.ResponseWriter, r *http.Request) error {
	if s.bgp == nil {
		return &engine.NotSupportedError{Msg: "this daemon runs no BGP speaker (start it with --bgp-config)"}
	}
	st, err := s.bgp.Status(r.Context())
	if err != nil {
		return err
	}
	body, err := json.Marshal(st)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, append(body, '\n'))
	return nil
}
