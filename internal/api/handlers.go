package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// readBody reads a request body of at most limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body, err := readAll(http.MaxBytesReader(w, r.Body, limit), min(r.ContentLength, limit, maxSizeHint))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, fmt.Errorf("request body is larger than %d bytes: %w", limit, err)
		}
		return nil, &httpError{status: http.StatusBadRequest, err: fmt.Errorf("read request body: %w", err)}
	}
	if len(body) == 0 {
		return nil, &model.StructureError{Msg: "request body is empty; send a JSON object"}
	}
	return body, nil
}

// maxSizeHint bounds what readBody reserves on a request's word (its
// Content-Length) before the bytes arrive.
const maxSizeHint = 1 << 20

// readAll is io.ReadAll into a buffer of size+1 bytes at first (the byte
// over lets it see the end without growing). io.ReadAll starts at 512
// bytes and grows: 10 allocations and as many copies for the 8.6 KB body
// of a farm of 100 backends.
func readAll(r io.Reader, size int64) ([]byte, error) {
	b := make([]byte, 0, max(size, 511)+1)
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // grow
		}
	}
}

// writeChunk is how much of a large response is built before it is written.
const writeChunk = 256 << 10

// writeFarms streams {"farms":[...]} from the farms' cached encodings, in
// large writes that bypass the server's small output buffer.
func writeFarms(w http.ResponseWriter, farms []*model.Farm) {
	w.Header().Set("Content-Type", "application/json")
	// The length is known up front (the farms' encodings are cached), so the
	// body goes out with a Content-Length instead of chunked framing, which
	// costs a whole-state dump ~10 % on loopback.
	const head, tail = `{"farms":[`, "]}\n"
	size := len(head) + len(tail) + max(len(farms)-1, 0)
	for _, f := range farms {
		size += f.JSONLen()
	}
	w.Header().Set("Content-Length", strconv.Itoa(size))
	buf := make([]byte, 0, min(size, writeChunk+8192))
	buf = append(buf, head...)
	for i, f := range farms {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = f.AppendJSON(buf)
		if len(buf) >= writeChunk {
			if _, err := w.Write(buf); err != nil {
				return // the client went away
			}
			buf = buf[:0]
		}
	}
	buf = append(buf, tail...)
	w.Write(buf)
}

// writeListing sends the ipvsadm-style table.
func (s *Server) writeListing(w http.ResponseWriter, farms []*model.Farm, numeric bool) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	buf := make([]byte, 0, len(model.ListingHeader)+len(farms)*128)
	buf = append(buf, model.ListingHeader...)
	for _, f := range farms {
		buf = s.appendListing(buf, f, numeric) // health.go
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(buf)))
	w.Write(buf)
}

func boolParam(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	switch v {
	case "", "0", "false", "no":
		return false, nil
	case "1", "true", "yes":
		return true, nil
	}
	return false, &httpError{status: http.StatusBadRequest,
		err: fmt.Errorf("query parameter %q value %q: allowed values are 1, true, yes, 0, false, no", name, model.Clip(v))}
}

func (s *Server) getFarms(w http.ResponseWriter, r *http.Request) error {
	farms := s.eng.Snapshot().Farms()
	// Every parameter is checked whatever the format: ?stats=AAA is a
	// mistake even where stats means nothing.
	numeric, err := boolParam(r, "numeric")
	if err != nil {
		return err
	}
	stats, err := boolParam(r, "stats")
	if err != nil {
		return err
	}
	rate, err := boolParam(r, "rate")
	if err != nil {
		return err
	}
	conns, err := boolParam(r, "conns")
	if err != nil {
		return err
	}
	switch format := r.URL.Query().Get("format"); format {
	case "", "json":
		writeFarms(w, farms)
	case "ipvsadm":
		switch {
		case stats && rate || stats && conns || rate && conns:
			return &httpError{status: http.StatusBadRequest, err: errors.New("query parameters \"stats\", \"rate\" and \"conns\": give one of them")}
		case conns:
			return s.writeConnsListing(w, r, farms, numeric)
		case stats:
			return s.writeStatsListing(w, r, numeric)
		case rate:
			return s.writeRateListing(w, farms, numeric)
		}
		s.writeListing(w, farms, numeric)
	case "names":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		buf := make([]byte, 0, len(farms)*16)
		for _, f := range farms {
			buf = append(append(buf, f.Name...), '\n')
		}
		w.Write(buf)
	default:
		return &httpError{status: http.StatusBadRequest,
			err: fmt.Errorf("query parameter \"format\" value %q: allowed values are json, ipvsadm, names", model.Clip(format))}
	}
	return nil
}

// putFarms upserts every farm of the body in one transaction, each patched
// onto its current version (nftlb's semantics). The body is decoded inside
// the transaction so that concurrent patches of one farm never lose updates.
func (s *Server) putFarms(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r, MaxBulkBody)
	if err != nil {
		return err
	}
	if err := s.upsert(r, body); err != nil {
		if isDocumentKey(err) {
			return s.putDocument(w, r, body) // document.go
		}
		return err
	}
	writeOK(w)
	return nil
}

func (s *Server) upsert(r *http.Request, body []byte) error {
	_, err := s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		farms, err := model.DecodeFarmsWith(body, tx.Get, addressLookup(tx))
		if err != nil {
			return badRequest(err)
		}
		for _, f := range farms {
			if old := f.RenamedFrom(); old != "" {
				// nftlb's "newname": the farm moves to its new name.
				if err := tx.Delete(old); err != nil {
					return err
				}
			}
			if err := tx.Put(f); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

func (s *Server) getFarm(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	f, ok := s.eng.Snapshot().Farm(name)
	if !ok {
		// nftlb answers 500 here; 404 tells a missing farm from a broken
		// server (docs/nftlb-compat.md).
		return failed(textInvalidRequest, &engine.NotFoundError{What: fmt.Sprintf("farm %q", name)})
	}
	s.writeFarm(w, f) // health.go
	return nil
}

// putFarm upserts one farm. The body is {"farms":[{...}]} or a bare farm
// object; a name in it must be the one in the path, and is filled in if left out.
func (s *Server) putFarm(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	body, err := readBody(w, r, MaxBody)
	if err != nil {
		return err
	}
	item, err := farmBodyFor(body, name)
	if err != nil {
		return err
	}
	if err := s.upsert(r, item); err != nil {
		return err
	}
	writeOK(w)
	return nil
}

func farmBodyFor(body []byte, name string) ([]byte, error) {
	obj, err := jsonObject(body)
	if err != nil {
		return nil, err
	}
	if farms, ok := obj["farms"]; ok {
		for k := range obj {
			if k != "farms" {
				return nil, &model.FieldError{Field: k, Problem: "unknown top-level field; the body is {\"farms\": [{...}]} or one farm object"}
			}
		}
		var items []json.RawMessage
		if err := json.Unmarshal(farms, &items); err != nil || len(items) != 1 {
			return nil, &model.FieldError{Field: "farms", Problem: fmt.Sprintf("must be an array holding exactly the farm %q", name)}
		}
		if obj, err = jsonObject(items[0]); err != nil {
			return nil, &model.FieldError{Field: "farms[0]", Problem: "must be a JSON object"}
		}
	}
	if raw, ok := obj["name"]; ok {
		var got string
		if json.Unmarshal(raw, &got) != nil {
			got = string(raw)
		}
		if got != name {
			return nil, &model.FieldError{Object: fmt.Sprintf("farm %q", name), Field: "name", Value: got,
				Problem: fmt.Sprintf("does not match the farm name %q in the path", name)}
		}
	} else {
		obj["name"], _ = json.Marshal(name)
	}
	return json.Marshal(obj)
}

// jsonObject reads body into a map. A key given twice is refused first:
// the map would keep its last value silently.
func jsonObject(body []byte) (map[string]json.RawMessage, error) {
	if err := model.CheckUniqueKeys(body); err != nil {
		return nil, err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil || obj == nil {
		if err == nil {
			err = errors.New("null")
		}
		return nil, &model.StructureError{Msg: fmt.Sprintf("request body is not a JSON object: %v", err)}
	}
	return obj, nil
}

func (s *Server) deleteFarm(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	body, err := optionalBody(w, r)
	if err != nil {
		return err
	}
	if len(body) > 0 {
		return s.deleteListed(w, r, body)
	}
	if _, err := s.eng.Change(r.Context(), func(tx *engine.Txn) error { return tx.Delete(name) }); err != nil {
		return failed(textDeleteFarm, err)
	}
	writeOK(w)
	return nil
}

func (s *Server) getBackends(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	f, ok := s.eng.Snapshot().Farm(name)
	if !ok {
		return &engine.NotFoundError{What: fmt.Sprintf("farm %q", name)}
	}
	writeJSON(w, http.StatusOK, f.AppendBackendsJSON(nil))
	return nil
}

// putBackends upserts backends of an existing farm by name. The body is
// {"backends":[...]} or one backend object.
func (s *Server) putBackends(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	body, err := readBody(w, r, MaxBody)
	if err != nil {
		return err
	}
	obj, err := jsonObject(body)
	if err != nil {
		return err
	}
	backends, ok := obj["backends"]
	if ok {
		for k := range obj {
			if k != "backends" {
				return &model.FieldError{Field: k, Problem: "unknown top-level field; the body is {\"backends\": [...]} or one backend object"}
			}
		}
	} else {
		backends = append(append([]byte{'['}, body...), ']')
	}
	patch, err := json.Marshal(map[string]json.RawMessage{"name": mustJSON(name), "backends": backends})
	if err != nil {
		return badRequest(fmt.Errorf("field \"backends\": %v", err))
	}
	_, err = s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		if _, ok := tx.Get(name); !ok {
			return &engine.NotFoundError{What: fmt.Sprintf("farm %q", name)}
		}
		farms, err := model.DecodeFarms(patch, tx.Get)
		if err != nil {
			return badRequest(err)
		}
		return tx.Put(farms[0])
	})
	if err != nil {
		return err
	}
	writeOK(w)
	return nil
}

func mustJSON(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

func (s *Server) deleteBackend(w http.ResponseWriter, r *http.Request) error {
	name, backend := r.PathValue("name"), r.PathValue("backend")
	_, err := s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		f, ok := tx.Get(name)
		if !ok {
			return &engine.NotFoundError{What: fmt.Sprintf("farm %q", name)}
		}
		_, i := f.Backend(backend)
		if i < 0 {
			return &engine.NotFoundError{What: fmt.Sprintf("farm %q backend %q", name, backend)}
		}
		nf := f.Clone()
		nf.Backends = slices.Delete(nf.Backends, i, i+1)
		return tx.Put(nf)
	})
	if err != nil {
		return failed(textDeleteBackend, err)
	}
	writeOK(w)
	return nil
}

func (s *Server) getState(w http.ResponseWriter, r *http.Request) error {
	writeState(w, s.eng.Snapshot())
	return nil
}

// putState replaces the whole state with the body's farms in one transaction.
func (s *Server) putState(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r, MaxBulkBody)
	if err != nil {
		return err
	}
	// A restore is not a patch: every farm starts from the defaults.
	body, tables, err := model.SplitState(body)
	if err != nil {
		return badRequest(err)
	}
	none := func(string) (*model.Farm, bool) { return nil, false }
	farms, err := model.DecodeFarms(body, none)
	var addrs []model.Address
	if fe := (*model.FieldError)(nil); errors.As(err, &fe) && fe.Object == "" && fe.Field == "addresses" {
		// The address objects no farm uses (writeState): split off only
		// when there are some, so a restore without pays no second scan.
		var rest []byte
		if rest, addrs, err = model.SplitAddresses(body); err == nil {
			farms, err = model.DecodeFarms(rest, none)
		}
	}
	if err != nil {
		return badRequest(err)
	}
	_, err = s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		tx.ReplaceAll()
		tx.ReplaceAllAddresses()
		for _, a := range addrs {
			if err := tx.PutUnusedAddress(a); err != nil {
				return err
			}
		}
		if err := restoreTables(tx, tables); err != nil {
			return err
		}
		for _, f := range farms {
			if err := tx.Put(f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	writeOK(w)
	return nil
}

func (s *Server) getVersion(w http.ResponseWriter, r *http.Request) error {
	snap := s.eng.Snapshot()
	body, err := json.Marshal(map[string]string{
		"version":       Version(),
		"farms":         strconv.Itoa(snap.Len()),
		"state-version": strconv.FormatUint(snap.Version(), 10),
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, append(body, '\n'))
	return nil
}

// Version is the xlb build's version, from the Go build information.
func Version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "devel"
}
