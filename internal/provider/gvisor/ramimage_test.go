package gvisor

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/useshards/shard/internal/provider"
)

// ramImage makes a checkpoint dir whose pages.img links to a file of size
// bytes in a RAM-like directory, as StageImage and the Sentry leave it.
func ramImage(t *testing.T, size int) (dir, ram string, want []byte) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "ck1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ram = filepath.Join(t.TempDir(), "ck1.pages")
	want = make([]byte, size)
	rand.Read(want)
	if err := os.WriteFile(ram, want, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ram, filepath.Join(dir, pagesFile)); err != nil {
		t.Fatal(err)
	}
	return dir, ram, want
}

func TestPersisted(t *testing.T) {
	for _, tt := range []struct {
		name string
		size int
	}{
		{"whole pages over several buffers", 9<<20 + 3*4096},
		{"a tail that is not whole blocks", 2*4096 + 100},
		{"empty", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir, ram, want := ramImage(t, tt.size)
			p := &Provider{}
			if err := p.Persisted(t.Context(), dir); err != nil {
				t.Fatalf("Persisted = %v", err)
			}
			path := filepath.Join(dir, pagesFile)
			st, err := os.Lstat(path)
			if err != nil || !st.Mode().IsRegular() {
				t.Fatalf("pages.img after Persisted: %v, %v; want a regular file", st, err)
			}
			got, _ := os.ReadFile(path)
			if !bytes.Equal(got, want) {
				t.Errorf("pages.img has %d bytes, not the %d in RAM", len(got), len(want))
			}
			if _, err := os.Stat(ram); !os.IsNotExist(err) {
				t.Errorf("the RAM copy is still there (%v)", err)
			}
			if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
				t.Errorf("a .tmp file is left")
			}
			// Again: on disk already, nothing to do.
			if err := p.Persisted(t.Context(), dir); err != nil {
				t.Errorf("second Persisted = %v", err)
			}
		})
	}
}

func TestPersistedLostRAM(t *testing.T) {
	dir, ram, _ := ramImage(t, 4096)
	os.Remove(ram) // a host restart emptied tmpfs
	if err := (&Provider{}).Persisted(t.Context(), dir); !errors.Is(err, provider.ErrImageLost) {
		t.Fatalf("Persisted of an image whose RAM copy is gone = %v, want ErrImageLost", err)
	}
}

func TestRemoveImageFreesRAM(t *testing.T) {
	dir, ram, _ := ramImage(t, 4096)
	if err := provider.RemoveImage(dir); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, ram} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there after RemoveImage (%v)", p, err)
		}
	}
	// A removed checkpoint: persisting it is not an error, and leaves nothing.
	if err := (&Provider{}).Persisted(t.Context(), dir); err != nil {
		t.Errorf("Persisted of a removed checkpoint = %v, want nil", err)
	}
}

func TestShmemOf(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name, stat string
		want       int64
		ok         bool
	}{
		{"v1: the hierarchical total wins", "cache 100\nshmem 4096\nrss 5\ntotal_shmem 8192\n", 8192, true},
		{"v2", "anon 10\nfile 20\nshmem 12288\n", 12288, true},
		{"none", "anon 10\n", 0, false},
	} {
		f := filepath.Join(dir, "memory.stat")
		os.WriteFile(f, []byte(tt.stat), 0o600)
		if got, ok := shmemOf(f); got != tt.want || ok != tt.ok {
			t.Errorf("%s: shmemOf = %d, %v; want %d, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}
