package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/xlb-lb/xlb/internal/model"
)

// A full disk must not stop the daemon from starting: a journal with
// records folds them into the bbolt file at open, which may need room the
// disk no longer has, and a new journal is preallocated. Then the state
// opens read-only: the bbolt file read-only, the journal's records
// replayed in memory (nothing is written), every change refused with an
// *UnavailableError. The daemon serves reads and keeps the kernel as the
// saved state says; once space is freed, a restart makes it writable.

// openReadOnly opens the state in dir read-only; cause is why it could
// not be opened for writing.
func openReadOnly(dir string, cause error) (*Journal, error) {
	j := &Journal{ro: &UnavailableError{Dir: dir,
		Reason: fmt.Sprintf("the daemon runs read-only: the state directory had no room to open for writing (%v); free space and restart the daemon", cause)}}
	path := filepath.Join(dir, FileName)
	if _, err := os.Stat(path); err == nil {
		db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 2 * time.Second})
		if err != nil {
			return nil, fmt.Errorf("open state %q read-only: %w (opening it for writing failed: %v)", path, err, cause)
		}
		j.db = &Bolt{db: db, dir: dir}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("open state %q read-only: %w", path, err)
	}
	f, err := os.Open(filepath.Join(dir, JournalName))
	switch {
	case err == nil:
		j.f = f
	case !errors.Is(err, fs.ErrNotExist):
		j.Close()
		return nil, fmt.Errorf("open state journal read-only: %w", err)
	}
	return j, nil
}

// ReadOnly returns why the state takes no change (an *UnavailableError),
// or nil when it is writable.
func (j *Journal) ReadOnly() error {
	if j.ro == nil {
		return nil
	}
	return j.ro
}

// loadReadOnly is LoadSaved of a read-only state: the bbolt file's farms
// with the journal's records applied in memory.
func (j *Journal) loadSavedReadOnly(ctx context.Context) ([]SavedFarm, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	byName := map[string]SavedFarm{}
	if j.db != nil {
		saved, err := j.db.LoadSaved(ctx)
		if err != nil {
			return nil, err
		}
		for _, sf := range saved {
			byName[sf.Name] = sf
		}
	}
	if j.f != nil {
		buf, err := io.ReadAll(j.f)
		if _, serr := j.f.Seek(0, io.SeekStart); err == nil {
			err = serr
		}
		if err != nil {
			return nil, fmt.Errorf("load state: read journal: %w", err)
		}
		for _, r := range validRecords(buf) {
			redo, _, _, _, err := r.split()
			if err == nil {
				err = decodeUndo(redo, func(name string, v []byte) error {
					if v == nil {
						delete(byName, name)
					} else {
						byName[name] = decodeSaved([]byte(name), v)
					}
					return nil
				})
			}
			if err != nil {
				return nil, fmt.Errorf("load state: replay journal: %w", err)
			}
		}
	}
	migrated := j.db != nil && j.db.migrated()
	out := make([]SavedFarm, 0, len(byName))
	for _, sf := range byName {
		if !migrated {
			sf.Farm.IntraConnectOff = false // as migrate would write it
		}
		out = append(out, sf)
	}
	slices.SortFunc(out, func(a, b SavedFarm) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// loadReadOnly is Load of a read-only state.
func (j *Journal) loadReadOnly(ctx context.Context) ([]model.Farm, error) {
	saved, err := j.loadSavedReadOnly(ctx)
	if err != nil {
		return nil, err
	}
	farms := make([]model.Farm, 0, len(saved))
	for _, sf := range saved {
		if sf.Err != nil {
			return nil, fmt.Errorf("load state: saved farm %q: %w", sf.Name, sf.Err)
		}
		farms = append(farms, sf.Farm)
	}
	return farms, nil
}
