package gvisor

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/useshards/shard/internal/provider"
	"golang.org/x/sys/unix"
)

// sparseMemory writes a memory-file-like sparse file at path: data at a few
// page-aligned ranges, holes between and after; it returns its contents.
func sparseMemory(t *testing.T, path string) []byte {
	t.Helper()
	const size = 64 << 20
	want := make([]byte, size)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, r := range [][2]int{{0, 3 << 12}, {1 << 20, 5 << 20}, {40 << 20, 40<<20 + 1<<12}} {
		rand.Read(want[r[0]:r[1]])
		if _, err := f.WriteAt(want[r[0]:r[1]], int64(r[0])); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return want
}

// TestCopyMemoryFile: a fork's copy of a memory file has its bytes and its
// holes, from tmpfs (in the kernel) and from a disk (through a buffer: the
// kernel refuses a copy between two kinds of filesystem).
func TestCopyMemoryFile(t *testing.T) {
	shm := t.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "shard-test-"); err == nil {
			shm = d
			t.Cleanup(func() { os.RemoveAll(d) })
		}
	}
	for _, tt := range []struct{ name, from, to string }{
		{"tmpfs to tmpfs", shm, shm},
		{"disk to tmpfs", t.TempDir(), shm},
		{"tmpfs to disk", shm, t.TempDir()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src, dst := filepath.Join(tt.from, "src.mem"), filepath.Join(tt.to, "dst.mem")
			want := sparseMemory(t, src)
			if err := CopyMemoryFile(dst, src); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(dst)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("the copy differs from its source (%d bytes, want %d)", len(got), len(want))
			}
			var st unix.Stat_t
			if err := unix.Stat(dst, &st); err != nil {
				t.Fatal(err)
			}
			if used := st.Blocks * 512; used > 8<<20 {
				t.Errorf("the copy takes %d bytes: its source's holes were filled", used)
			}
		})
	}
}

// TestForEachExtent: the data ranges of a sparse file, in order.
func TestForEachExtent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	sparseMemory(t, path)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got [][2]int64
	if err := forEachExtent(f, func(off, n int64) error { got = append(got, [2]int64{off, n}); return nil }); err != nil {
		t.Fatal(err)
	}
	var total int64
	for i, e := range got {
		if i > 0 && e[0] < got[i-1][0]+got[i-1][1] {
			t.Fatalf("extents out of order or overlapping: %v", got)
		}
		total += e[1]
	}
	// A filesystem may report more than was written (whole blocks), never less.
	if total < 3<<12+4<<20+1<<12 || total > 8<<20 {
		t.Errorf("extents %v hold %d bytes", got, total)
	}
}

// TestPersistedMemoryFile: a checkpoint's memory.img in RAM reaches the
// disk with its bytes and its holes, and the RAM copy is freed; one whose
// RAM copy a host restart took is lost.
func TestPersistedMemoryFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ck1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ram := filepath.Join(t.TempDir(), "ck1.pages.mem")
	want := sparseMemory(t, ram)
	if err := os.Symlink(ram, filepath.Join(dir, memoryFile)); err != nil {
		t.Fatal(err)
	}
	if err := (&Provider{}).Persisted(t.Context(), dir); err != nil {
		t.Fatalf("Persisted = %v", err)
	}
	path := filepath.Join(dir, memoryFile)
	if st, err := os.Lstat(path); err != nil || !st.Mode().IsRegular() {
		t.Fatalf("memory.img after Persisted: %v, %v; want a regular file", st, err)
	}
	got, _ := os.ReadFile(path)
	if !bytes.Equal(got, want) {
		t.Fatalf("memory.img on disk differs from the RAM copy")
	}
	var st unix.Stat_t
	unix.Stat(path, &st)
	if used := st.Blocks * 512; used > 8<<20 {
		t.Errorf("memory.img takes %d bytes on disk: its holes were filled", used)
	}
	if _, err := os.Stat(ram); !os.IsNotExist(err) {
		t.Errorf("the RAM copy is still there (%v)", err)
	}

	lost := filepath.Join(t.TempDir(), "ck2")
	os.MkdirAll(lost, 0o700)
	os.Symlink(filepath.Join(t.TempDir(), "gone.mem"), filepath.Join(lost, memoryFile))
	if err := (&Provider{}).Persisted(t.Context(), lost); !errors.Is(err, provider.ErrImageLost) {
		t.Errorf("Persisted of a memory file whose RAM copy is gone = %v, want ErrImageLost", err)
	}
}

// TestSentryMemoryIgnoresDecoys: of the files the Sentry holds, only its own
// memfd (or the copy it adopted, by its exact path on tmpfs) is its memory,
// however the sandbox names its own files.
func TestSentryMemoryIgnoresDecoys(t *testing.T) {
	const id = "0123456789ab"
	dir := t.TempDir()
	p := New(Options{ImageRAM: dir})
	p.pids.Store(id, os.Getpid()) // this process plays the Sentry
	// Decoys first (lower fds): files named like both kinds of memory file.
	for _, name := range []string{"fork-" + id + ".mem", "runsc-memory"} {
		f, err := os.Create(filepath.Join(t.TempDir(), name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
	}
	fd, err := unix.MemfdCreate("runsc-memory", 0)
	if err != nil {
		t.Fatalf("memfd_create: %v", err)
	}
	memfd := os.NewFile(uintptr(fd), "memfd")
	defer memfd.Close()
	var want unix.Stat_t
	unix.Fstat(fd, &want)

	got, err := p.sentryMemory(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	var st unix.Stat_t
	unix.Fstat(int(got.Fd()), &st)
	if st.Ino != want.Ino || st.Dev != want.Dev {
		t.Fatalf("sentryMemory picked %s, not the memfd", got.Name())
	}
}
