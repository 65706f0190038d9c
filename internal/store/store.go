// Package store keeps xlb's desired state durable on local disk in an
// embedded bbolt database: one key per farm, so a change writes only the farms
// it touches, and every write is fsynced before the engine acknowledges it.
package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

var farmsBucket = []byte("farms")

// Store is the durable copy of the desired state.
type Store interface {
	// Load returns every saved farm.
	Load(ctx context.Context) ([]model.Farm, error)
	// Apply saves a diff atomically (all of it or none of it).
	Apply(ctx context.Context, d dataplane.Diff) error
	Close() error
}

// Bolt is a Store in a bbolt file.
type Bolt struct {
	db *bolt.DB
}

// FileName is the database's name inside the state directory.
const FileName = "xlb.db"

// OpenBolt opens (creating if needed) the state database in dir.
func OpenBolt(dir string) (*Bolt, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir %q: %w", dir, err)
	}
	path := filepath.Join(dir, FileName)
	// The timeout turns "another xlb daemon holds this state dir" into an
	// error instead of a hang.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("open state %q: locked by another process (is another xlb daemon using this --state-dir?)", path)
		}
		return nil, fmt.Errorf("open state %q: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(farmsBucket)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("init state %q: %w", path, err)
	}
	return &Bolt{db: db}, nil
}

// Load implements Store.
func (s *Bolt) Load(ctx context.Context) ([]model.Farm, error) {
	var farms []model.Farm
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(farmsBucket).ForEach(func(k, v []byte) error {
			fs, err := model.DecodeFarms(v, func(string) (*model.Farm, bool) { return nil, false })
			if err != nil {
				return fmt.Errorf("saved farm %q: %w", k, err)
			}
			farms = append(farms, fs...)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("load state: %w", err)
	}
	return farms, nil
}

// Apply implements Store.
func (s *Bolt) Apply(ctx context.Context, d dataplane.Diff) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(farmsBucket)
		for _, c := range d.Changes {
			if c.Old != nil && (c.New == nil || c.New.Name != c.Old.Name) {
				if err := b.Delete([]byte(c.Old.Name)); err != nil {
					return err
				}
			}
			if c.New != nil {
				if err := b.Put([]byte(c.New.Name), c.New.AppendJSON(nil)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	return nil
}

// Close implements Store.
func (s *Bolt) Close() error { return s.db.Close() }
