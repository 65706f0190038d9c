package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/xlb-lb/xlb/internal/model"
)

// SavedFarm is one farm as the state directory holds it. Start-up never
// refuses the daemon's own saved state: a farm that cannot be read is
// returned with Err set, and the engine reports it and sets it aside
// instead of failing to start.
type SavedFarm struct {
	Name string     // its key in the state file
	Raw  []byte     // its saved JSON, as saved
	Farm model.Farm // decoded, not validated; zero when Err is set
	Err  error      // why it could not be decoded
}

// SavedLoader is a Store that can load farms one by one and move the ones
// the daemon cannot serve out of the saved state.
type SavedLoader interface {
	// LoadSaved returns every saved farm, decoded but not validated.
	LoadSaved(ctx context.Context) ([]SavedFarm, error)
	// SetAside writes each farm's saved JSON to a file of its own under
	// <state-dir>/set-aside/ (synced), then deletes the farms from the
	// saved state, and returns the files by farm name.
	SetAside(ctx context.Context, farms []SavedFarm) (map[string]string, error)
}

// SetAsideDir is where SetAside puts farms, inside the state directory.
const SetAsideDir = "set-aside"

var (
	_ SavedLoader = (*Bolt)(nil)
	_ SavedLoader = (*Journal)(nil)
)

// LoadSaved implements SavedLoader.
func (s *Bolt) LoadSaved(ctx context.Context) ([]SavedFarm, error) {
	var out []SavedFarm
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(farmsBucket).ForEach(func(k, v []byte) error {
			out = append(out, decodeSaved(k, v))
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("load state: %w", err)
	}
	return out, nil
}

// decodeSaved decodes one saved farm (k, v: its key and JSON; copied).
func decodeSaved(k, v []byte) SavedFarm {
	sf := SavedFarm{Name: string(k), Raw: append([]byte(nil), v...)}
	fs, err := model.DecodeFarmsUnchecked(v)
	switch {
	case err != nil:
		sf.Err = err
	case len(fs) != 1 || fs[0].Name != sf.Name:
		sf.Err = fmt.Errorf("holds %d farms, not the one farm %q", len(fs), sf.Name)
	default:
		sf.Farm = fs[0]
	}
	return sf
}

// SetAside implements SavedLoader.
func (s *Bolt) SetAside(ctx context.Context, farms []SavedFarm) (map[string]string, error) {
	if len(farms) == 0 {
		return nil, nil
	}
	dir := filepath.Join(s.dir, SetAsideDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("set aside saved farms: %w", err)
	}
	stamp := time.Now().UTC().Format("20060102T150405Z")
	files := make(map[string]string, len(farms))
	for _, f := range farms {
		// Farm names are plain ([A-Za-z0-9_.-]); a key that is not
		// (a corrupt file) is written under a safe name.
		base := f.Name
		if !model.ValidName(base) {
			base = "farm-" + strings.Map(func(r rune) rune {
				if r < 0x80 && model.ValidName(string(r)) {
					return r
				}
				return '_'
			}, base)
		}
		path := filepath.Join(dir, base+"."+stamp+".json")
		if err := writeSynced(path, f.Raw); err != nil {
			return files, fmt.Errorf("set aside saved farm %q: %w", f.Name, err)
		}
		files[f.Name] = path
	}
	if err := syncDir(dir); err != nil {
		return files, fmt.Errorf("set aside saved farms: %w", err)
	}
	// Only now, with every copy on disk, do the farms leave the state.
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(farmsBucket)
		for _, f := range farms {
			if err := b.Delete([]byte(f.Name)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return files, fmt.Errorf("set aside saved farms: remove them from the state: %w", err)
	}
	return files, nil
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// LoadSaved implements SavedLoader.
func (j *Journal) LoadSaved(ctx context.Context) ([]SavedFarm, error) {
	if j.ro != nil {
		return j.loadSavedReadOnly(ctx)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.fold(); err != nil {
		return nil, fmt.Errorf("load state: %w", err)
	}
	return j.db.LoadSaved(ctx)
}

// SetAside implements SavedLoader.
func (j *Journal) SetAside(ctx context.Context, farms []SavedFarm) (map[string]string, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.fold(); err != nil {
		return nil, fmt.Errorf("set aside saved farms: %w", err)
	}
	return j.db.SetAside(ctx, farms)
}
