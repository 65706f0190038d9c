package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/xlb-lb/xlb/internal/engine"
)

// sseKeepAlive is how often an idle event stream sends a comment, so
// proxies and clients see the connection is alive.
const sseKeepAlive = 15 * time.Second

// streams ends event streams when the server stops (http.Server.Shutdown
// waits for handlers, and a stream never ends by itself).
type streams struct {
	once sync.Once
	done chan struct{}
}

func (st *streams) ch() chan struct{} {
	st.once.Do(func() { st.done = make(chan struct{}) })
	return st.done
}

// StopStreams ends every event stream (GET /events) and makes new ones
// end at once: register it with http.Server.RegisterOnShutdown.
func (s *Server) StopStreams() {
	ch := s.streams.ch()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// getEvents streams events (health transitions, weight changes, quorum
// changes, flushes) as server-sent events until the client goes away. A
// client that reconnects with Last-Event-ID (or ?since=ID) first gets the
// kept events after that id.
func (s *Server) getEvents(w http.ResponseWriter, r *http.Request) error {
	if s.events == nil {
		return &engine.NotSupportedError{Msg: "this server publishes no events"}
	}
	var after uint64
	for _, v := range []string{r.Header.Get("Last-Event-ID"), r.URL.Query().Get("since")} {
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return &httpError{status: http.StatusBadRequest, err: fmt.Errorf("event id %q: must be a whole number", v)}
		}
		after = n
	}
	sub := s.events.Subscribe(after, 1024)
	defer s.events.Cancel(sub)
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if _, err := fmt.Fprint(w, ": xlb events\n\n"); err != nil {
		return nil
	}
	rc.Flush()
	stop := s.streams.ch()
	tick := time.NewTicker(sseKeepAlive)
	defer tick.Stop()
	for {
		var err error
		select {
		case <-r.Context().Done():
			return nil
		case <-stop:
			return nil
		case <-tick.C:
			_, err = fmt.Fprint(w, ": keep-alive\n\n")
		case ev := <-sub.C:
			if n := sub.Dropped(); n > 0 {
				fmt.Fprintf(w, "event: dropped\ndata: {\"dropped\":%d}\n\n", n)
			}
			data, _ := json.Marshal(ev)
			_, err = fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", ev.ID, ev.Kind, data)
		}
		if err != nil || rc.Flush() != nil {
			return nil // the client went away
		}
	}
}
