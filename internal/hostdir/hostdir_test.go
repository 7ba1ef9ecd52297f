package hostdir

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/useshards/shard/internal/testenv"
)

func TestPrivate(t *testing.T) {
	base := t.TempDir()
	for _, tc := range []struct {
		name string
		prep func(string) error
	}{
		{"new", func(string) error { return nil }},
		{"existing 0711", func(p string) error { return os.Mkdir(p, 0o711) }},
		{"existing 0777", func(p string) error { return os.Mkdir(p, 0o777) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(base, tc.name, "sub")
			os.MkdirAll(filepath.Dir(p), 0o755)
			if err := tc.prep(p); err != nil {
				t.Fatal(err)
			}
			os.Chmod(p, 0o777) // undo the umask
			if tc.name == "new" {
				os.Remove(p)
			}
			if err := Private(p); err != nil {
				t.Fatal(err)
			}
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if got := st.Mode().Perm(); got != 0o700 {
				t.Errorf("mode %v, want 0700", got)
			}
		})
	}
	f := filepath.Join(base, "file")
	os.WriteFile(f, nil, 0o644)
	if err := Private(f); err == nil {
		t.Error("a file is not a directory: want an error")
	}
}

// A filesystem mounted below the directory is not the directory's: a
// running sandbox's root under run/ once counted as the server's own.
func TestBlocksStaysOnItsFilesystem(t *testing.T) {
	testenv.RequireRoot(t, "mounts a tmpfs")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "own"), make([]byte, 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	before := Blocks(dir)
	mnt := filepath.Join(dir, "sandbox", "rootfs")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=8m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(mnt, "big"), make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	// The two new directories take a few blocks; the mount's 4 MiB must not.
	if got := Blocks(dir); got < 64<<10 || got-before > 1<<20 {
		t.Fatalf("Blocks = %d (%d before the mount): want the tmpfs's 4 MiB left out", got, before)
	}
	if got := Blocks(mnt); got < 4<<20 {
		t.Fatalf("Blocks of the mount itself = %d: want its 4 MiB", got)
	}
}
