package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// Named tables (ipfw's lookup tables) under /tables. Batches of entries are
// JSON ({"entries": [{"key", "value", "timeout"}]}) or, with Content-Type
// text/plain, one entry a line as ipfw's "table T add" takes them
// (KEY [VALUE] [timeout SECONDS]; '#' starts a comment).

// MaxTableBody bounds a batch of entries: a million CIDRs as text are about
// 16 MB, as JSON about 30 MB.
const MaxTableBody = 256 << 20

var tableRoutes = []Route{
	{Method: http.MethodGet, Path: "/tables", handle: (*Server).getTables},
	{Method: http.MethodPost, Path: "/tables", Write: true, handle: (*Server).postTables},
	{Method: http.MethodGet, Path: "/tables/{name}", handle: (*Server).getTable},
	{Method: http.MethodPut, Path: "/tables/{name}", Write: true, handle: (*Server).putTable},
	{Method: http.MethodDelete, Path: "/tables/{name}", Write: true, handle: (*Server).deleteTable},
	{Method: http.MethodGet, Path: "/tables/{name}/entries", handle: (*Server).getEntries},
	{Method: http.MethodGet, Path: "/tables/{name}/counters", handle: (*Server).getTableCounters},
	{Method: http.MethodPost, Path: "/tables/{name}/entries", Write: true, handle: (*Server).postEntries},
	{Method: http.MethodDelete, Path: "/tables/{name}/entries", Write: true, handle: (*Server).deleteEntries},
	{Method: http.MethodDelete, Path: "/tables/{name}/entries/{key...}", Write: true, handle: (*Server).deleteEntry},
	{Method: http.MethodPost, Path: "/tables/{name}/flush", Write: true, handle: (*Server).flushTable},
	{Method: http.MethodPost, Path: "/tables/{name}/swap/{other}", Write: true, handle: (*Server).swapTables},
	{Method: http.MethodGet, Path: "/tables/{name}/lookup/{key...}", handle: (*Server).lookupTable},
}

// writeState sends the whole state: {"farms":[...]} and, when there are
// tables, "tables" with their entries.
func writeState(w http.ResponseWriter, s *engine.State) {
	tables, addrs := s.Tables(), s.UnusedAddresses()
	if len(tables) == 0 && len(addrs) == 0 {
		writeFarms(w, s.Farms())
		return
	}
	buf := model.AppendFarmsJSON(nil, s.Farms())
	buf = buf[:len(buf)-len("}\n")]
	if len(tables) > 0 {
		buf = model.AppendTablesJSON(append(buf, ','), tables, model.VocabTables, true, nil, time.Now().Unix())
	}
	// The address objects no farm uses (those a farm uses are in it).
	buf = model.AppendUnusedAddressesJSON(buf, addrs)
	buf = append(buf, "}\n"...)
	w.Header().Set("Content-Length", strconv.Itoa(len(buf)))
	writeJSON(w, http.StatusOK, buf)
}

// restoreTables puts the tables of a restore body into tx; their entries
// replace what the tables hold.
func restoreTables(tx *engine.Txn, tables []model.TableDecl) error {
	for _, td := range tables {
		if err := tx.PutTable(td.Table); err != nil {
			return err
		}
		if err := tx.ReplaceEntries(td.Table.Name, td.Entries); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) tableNamed(st *engine.State, name string) (*model.Table, error) {
	t, ok := st.Table(name)
	if !ok {
		return nil, &engine.NotFoundError{What: fmt.Sprintf("table %q", name)}
	}
	return t, nil
}

func (s *Server) getTables(w http.ResponseWriter, r *http.Request) error {
	st := s.eng.Snapshot()
	buf := append([]byte{'{'}, model.AppendTablesJSON(nil, st.Tables(), model.VocabTables, false, nil, 0)...)
	writeJSON(w, http.StatusOK, append(buf, "}\n"...))
	return nil
}

// postTables creates tables (ipfw's "table T create"): a table that exists
// is an error. Entries in the body are added all or nothing.
func (s *Server) postTables(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r, MaxTableBody)
	if err != nil {
		return err
	}
	_, err = s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		tds, err := model.DecodeTables(body, tx.Table, model.VocabTables)
		if err != nil {
			return badRequest(err)
		}
		for _, td := range tds {
			if td.Exists {
				return &engine.ConflictError{Msg: fmt.Sprintf("table %q exists (change it with PUT /tables/%s)", td.Table.Name, td.Table.Name)}
			}
			if err := tx.PutTable(td.Table); err != nil {
				return err
			}
			if _, err := tx.AddEntries(td.Table.Name, td.Entries, engine.EntryOptions{Atomic: true}); err != nil {
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

// getTable sends a table's definition and count (ipfw's "info"); with
// detail=1 also its estimated memory, and with entries=1 its entries.
func (s *Server) getTable(w http.ResponseWriter, r *http.Request) error {
	t, err := s.tableNamed(s.eng.Snapshot(), r.PathValue("name"))
	if err != nil {
		return err
	}
	entries, err := boolParam(r, "entries")
	if err != nil {
		return err
	}
	buf := t.AppendJSON(nil, model.VocabTables, entries, 0, time.Now().Unix())
	detail, err := boolParam(r, "detail")
	if err != nil {
		return err
	}
	if detail {
		buf = buf[:len(buf)-1]
		buf = fmt.Appendf(buf, `,"users":%s,"memory":"%d","algorithm":%q}`, jsonStrings(s.eng.Snapshot().TableUsers(t.Name)), t.MemoryEstimate(), s.eng.TableAlgorithm(t))
	}
	writeJSON(w, http.StatusOK, append(buf, '\n'))
	return nil
}

func jsonStrings(ss []string) string {
	b := []byte{'['}
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, s)
	}
	return string(append(b, ']'))
}

// putTable creates a table or changes its definition (limit, locked,
// timeout, verdict, log-prefix, priority: ipfw's "modify", "lock",
// "unlock"). With "entries" the table's entries are replaced, all or
// nothing.
func (s *Server) putTable(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r, MaxTableBody)
	if err != nil {
		return err
	}
	name := r.PathValue("name")
	_, err = s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		td, err := model.DecodeTable(body, name, tx.Table, model.VocabTables)
		if err != nil {
			return badRequest(err)
		}
		if err := tx.PutTable(td.Table); err != nil {
			return err
		}
		if td.HasEntries {
			return tx.ReplaceEntries(name, td.Entries)
		}
		return nil
	})
	if err != nil {
		return err
	}
	writeOK(w)
	return nil
}

func (s *Server) deleteTable(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if _, err := s.eng.Change(r.Context(), func(tx *engine.Txn) error { return tx.DestroyTable(name) }); err != nil {
		return err
	}
	writeOK(w)
	return nil
}

func (s *Server) flushTable(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if _, err := s.eng.Change(r.Context(), func(tx *engine.Txn) error { return tx.FlushTable(name) }); err != nil {
		return err
	}
	writeOK(w)
	return nil
}

func (s *Server) swapTables(w http.ResponseWriter, r *http.Request) error {
	a, b := r.PathValue("name"), r.PathValue("other")
	if _, err := s.eng.Change(r.Context(), func(tx *engine.Txn) error { return tx.SwapTables(a, b) }); err != nil {
		return err
	}
	writeOK(w)
	return nil
}

// getEntries lists a table's entries: JSON {"entries":[...]}, or with
// format=text one entry a line as "table T add" takes them.
func (s *Server) getEntries(w http.ResponseWriter, r *http.Request) error {
	t, err := s.tableNamed(s.eng.Snapshot(), r.PathValue("name"))
	if err != nil {
		return err
	}
	now := time.Now().Unix()
	switch f := r.URL.Query().Get("format"); f {
	case "text":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		buf := make([]byte, 0, min(t.Len()*24+64, writeChunk+4096))
		t.Entries("", func(e model.TableEntry) bool {
			buf = appendEntryLine(buf, t, e, now)
			if len(buf) >= writeChunk {
				if _, err := w.Write(buf); err != nil {
					return false
				}
				buf = buf[:0]
			}
			return true
		})
		w.Write(buf)
	case "", "json":
		buf := []byte(`{"entries":[`)
		first := true
		t.Entries("", func(e model.TableEntry) bool {
			if !first {
				buf = append(buf, ',')
			}
			first = false
			buf = t.AppendEntryJSON(buf, e, model.VocabTables, now)
			return true
		})
		writeJSON(w, http.StatusOK, append(buf, "]}\n"...))
	default:
		return &httpError{status: http.StatusBadRequest, err: fmt.Errorf("query parameter \"format\" value %q: allowed values are json, text", f)}
	}
	return nil
}

// appendEntryLine appends "KEY [VALUE] [timeout SECONDS]\n".
func appendEntryLine(buf []byte, t *model.Table, e model.TableEntry, now int64) []byte {
	buf = t.AppendKey(buf, e.Key)
	if t.Values != 0 {
		buf = t.AppendValue(append(buf, ' '), e.Value)
	}
	if e.Expires != 0 {
		buf = append(buf, " timeout "...)
		buf = strconv.AppendInt(buf, max(e.Expires-now, 0), 10)
	}
	return append(buf, '\n')
}

// readEntries reads a batch of entries: text lines or JSON.
func readEntries(body []byte, r *http.Request, table string, vocab model.Vocabulary) ([]model.EntryInput, error) {
	if isText(r) {
		var out []model.EntryInput
		sc := bufio.NewScanner(bytes.NewReader(body))
		sc.Buffer(make([]byte, 0, 4096), 1<<20)
		for n := 1; sc.Scan(); n++ {
			in, ok, err := model.ParseEntryLine(sc.Text())
			if err != nil {
				return nil, &httpError{status: http.StatusBadRequest, err: fmt.Errorf("table %q line %d: %w", table, n, err)}
			}
			if ok {
				out = append(out, in)
			}
		}
		return out, sc.Err()
	}
	ins, err := model.DecodeEntries(body, table, vocab)
	if err != nil {
		return nil, badRequest(err)
	}
	return ins, nil
}

func isText(r *http.Request) bool {
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return mt == "text/plain"
}

func entryOptions(r *http.Request) (engine.EntryOptions, error) {
	var o engine.EntryOptions
	var err error
	if o.Atomic, err = boolParam(r, "atomic"); err != nil {
		return o, err
	}
	o.Update, err = boolParam(r, "update")
	return o, err
}

// batchResult is the reply to a batch: how many entries were done and
// which failed, with why.
type batchResult struct {
	Response string       `json:"response"`
	Done     int          `json:"done"`
	Failed   int          `json:"failed"`
	Errors   []entryError `json:"errors,omitempty"`
}

type entryError struct {
	Key   string `json:"key"`
	Error string `json:"error"`
}

// writeBatch answers a batch without Atomic: 200 when at least one entry
// was done (the failures listed), the first failure's status when none was.
func writeBatch(w http.ResponseWriter, res []engine.EntryResult) error {
	out := batchResult{Response: textSuccess}
	var first error
	for _, r := range res {
		if r.Err == nil {
			out.Done++
			continue
		}
		out.Failed++
		if first == nil {
			first = r.Err
		}
		if len(out.Errors) < 1000 {
			out.Errors = append(out.Errors, entryError{Key: r.Key, Error: r.Err.Error()})
		}
	}
	status := http.StatusOK
	if out.Failed > 0 {
		out.Response = "partial"
		if out.Done == 0 {
			// Nothing done: an error reply, in nftlb's envelope
			// ("<text>. <first failure>"), with the list.
			status, out.Response = reply(first)
		}
	}
	body, _ := json.Marshal(out)
	writeJSON(w, status, append(body, '\n'))
	return nil
}

// postEntries adds a batch of entries (ipfw's "table T add"); atomic=1
// makes it all or nothing, update=1 replaces the values of entries that
// exist instead of failing them with "entry exists".
func (s *Server) postEntries(w http.ResponseWriter, r *http.Request) error {
	return s.entryBatch(w, r, model.VocabTables, func(tx *engine.Txn, name string, ins []model.EntryInput, o engine.EntryOptions) ([]engine.EntryResult, error) {
		return tx.AddEntries(name, ins, o)
	})
}

// deleteEntries deletes a batch of entries by key (ipfw's "table T
// delete"); values in the batch are ignored.
func (s *Server) deleteEntries(w http.ResponseWriter, r *http.Request) error {
	return s.entryBatch(w, r, model.VocabTables, deleteBatch)
}

func deleteBatch(tx *engine.Txn, name string, ins []model.EntryInput, o engine.EntryOptions) ([]engine.EntryResult, error) {
	keys := make([]string, len(ins))
	for i, in := range ins {
		keys[i] = in.Key
	}
	return tx.DeleteEntries(name, keys, o)
}

type batchFunc func(tx *engine.Txn, name string, ins []model.EntryInput, o engine.EntryOptions) ([]engine.EntryResult, error)

func (s *Server) entryBatch(w http.ResponseWriter, r *http.Request, vocab model.Vocabulary, fn batchFunc) error {
	name := r.PathValue("name")
	opts, err := entryOptions(r)
	if err != nil {
		return err
	}
	body, err := readBody(w, r, MaxTableBody)
	if err != nil {
		return err
	}
	ins, err := readEntries(body, r, name, vocab)
	if err != nil {
		return err
	}
	res, err := s.batch(r.Context(), name, ins, opts, fn)
	if err != nil {
		return err
	}
	return writeBatch(w, res)
}

// batch runs fn in one change. A batch in which every entry failed changes
// nothing and is reported as such.
func (s *Server) batch(ctx context.Context, name string, ins []model.EntryInput, opts engine.EntryOptions, fn batchFunc) ([]engine.EntryResult, error) {
	var res []engine.EntryResult
	_, err := s.eng.Change(ctx, func(tx *engine.Txn) error {
		var err error
		res, err = fn(tx, name, ins, opts)
		return err
	})
	return res, err
}

func (s *Server) deleteEntry(w http.ResponseWriter, r *http.Request) error {
	return s.deleteKey(w, r, r.PathValue("key"))
}

func (s *Server) deleteKey(w http.ResponseWriter, r *http.Request, key string) error {
	name := r.PathValue("name")
	_, err := s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		_, err := tx.DeleteEntries(name, []string{key}, engine.EntryOptions{Atomic: true})
		return err
	})
	if err != nil {
		return err
	}
	writeOK(w)
	return nil
}

// lookupTable answers ipfw's "table T lookup KEY": the entry that matches
// (for addr tables the most specific prefix holding the address) and its
// value, from the published snapshot without taking any lock.
func (s *Server) lookupTable(w http.ResponseWriter, r *http.Request) error {
	t, err := s.tableNamed(s.eng.Snapshot(), r.PathValue("name"))
	if err != nil {
		return err
	}
	key := r.PathValue("key")
	e, ok, err := t.Lookup(key)
	if err != nil {
		return err
	}
	if !ok {
		return &engine.NotFoundError{What: fmt.Sprintf("table %q entry matching %q", t.Name, key)}
	}
	buf := t.AppendEntryJSON(nil, e, model.VocabTables, time.Now().Unix())
	writeJSON(w, http.StatusOK, append(buf, '\n'))
	return nil
}

// EntryCountersJSON is one entry's counters on the wire (values as strings,
// as nftlb's).
type EntryCountersJSON struct {
	Key     string `json:"key"`
	Packets string `json:"packets"`
	Bytes   string `json:"bytes"`
}

// TableCountersJSON is the body of GET /tables/{name}/counters.
type TableCountersJSON struct {
	Name    string              `json:"name"`
	Entries []EntryCountersJSON `json:"entries"`
}

// getTableCounters answers the packets and bytes each entry matched in the
// data plane, in key order; entries that never matched are left out (a
// million-entry deny list answers only what it caught).
func (s *Server) getTableCounters(w http.ResponseWriter, r *http.Request) error {
	t, cs, err := s.eng.TableCounters(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	out := TableCountersJSON{Name: t.Name, Entries: []EntryCountersJSON{}}
	keys := make([]model.TableKey, 0, len(cs))
	for k := range cs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		c := cs[k]
		out.Entries = append(out.Entries, EntryCountersJSON{Key: t.FormatKey(k),
			Packets: strconv.FormatUint(c.Packets, 10), Bytes: strconv.FormatUint(c.Bytes, 10)})
	}
	body, err := json.Marshal(out)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, append(body, '\n'))
	return nil
}
