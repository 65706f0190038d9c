package testutil

import (
	"errors"
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// SmallFS mounts a tmpfs of size ("2m", "16m"...) on a new temporary
// directory, for tests of a full or small disk, and unmounts it at
// cleanup. It needs root (RequireRoot).
func SmallFS(tb testing.TB, size string) string {
	tb.Helper()
	RequireRoot(tb)
	dir := tb.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		tb.Fatalf("mount a %s tmpfs on %s: %v", size, dir, err)
	}
	tb.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			tb.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// FillFS writes a file into dir until its file system is full, and
// returns a function that removes it.
func FillFS(tb testing.TB, dir string) (free func()) {
	tb.Helper()
	f, err := os.CreateTemp(dir, "filler")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for _, n := range []int{64 << 10, 4096, 512, 1} {
		for {
			if _, err := f.Write(buf[:n]); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					tb.Fatal(err)
				}
				break
			}
		}
	}
	return func() { os.Remove(f.Name()) }
}
