// Package results writes what a benchmark measured: <name>.json for
// machines (the charts read it) and <name>.md for people, which is also
// printed.
package results

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Write writes doc as dir/name.json and md as dir/name.md, creating dir.
func Write(dir, name string, doc any, md string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("%s.json: %w", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Print("\n" + md)
	return os.WriteFile(filepath.Join(dir, name+".md"), []byte(md), 0o644)
}
