package rootfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/hostdisk"
	"github.com/useshards/shard/internal/testenv"
	"golang.org/x/sys/unix"
)

// newStore opens a store of size bytes in a temporary directory.
func newStore(t *testing.T, size int64) *Storage {
	t.Helper()
	testenv.RequireRoot(t, "loop-mounts an XFS store")
	for _, tool := range []string{"mkfs.xfs", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			if testenv.Strict() {
				t.Fatalf("%s is not installed: run scripts/install-deps.sh", tool)
			}
			t.Skipf("%s is not installed", tool)
		}
	}
	dir := t.TempDir()
	s, err := Open(context.Background(), Options{Dir: filepath.Join(dir, "storage"), Size: size})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ids, _ := s.List()
		for _, id := range ids {
			s.Remove(context.Background(), id)
		}
		Unmount(s.dir)
	})
	return s
}

func wantNoSpace(t *testing.T, err error, what string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: admitted, want insufficient_storage", what)
	}
	if errdefs.KindOf(err) != errdefs.KindNoSpace || errdefs.CodeOf(err) != "insufficient_storage" {
		t.Fatalf("%s: %v (kind %s), want insufficient_storage", what, err, errdefs.KindOf(err))
	}
}

func TestAdmission(t *testing.T) {
	s := newStore(t, 1<<30)
	ctx := context.Background()
	if err := s.Create(ctx, "a", 400<<20); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, "b", 300<<20); err != nil {
		t.Fatal(err)
	}
	// 700 MiB promised of 1 GiB, less metadata and margin: 300 more do not fit.
	wantNoSpace(t, s.Create(ctx, "c", 300<<20), "a third sandbox")
	wantNoSpace(t, s.Create(ctx, "huge", 100<<40), "a 100TiB sandbox")
	if _, err := os.Stat(filepath.Join(s.dir, "templates", "109951162777600.img")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused create made a template: %v", err)
	}
	wantNoSpace(t, s.Clone("a", "a2"), "a copy of a's disk")
	// A reservation holds its bytes against others until its file exists.
	r, err := s.Reserve(map[string]int64{s.ImagePath("r"): 100 << 20}, "a fork")
	if err != nil {
		t.Fatal(err)
	}
	sp, _ := s.Space()
	if err := s.Create(ctx, "d", sp.Free+1); err == nil {
		t.Error("a create spent bytes a reservation holds")
	}
	r.Release()
	if err := s.Create(ctx, "d", sp.Free+1); err != nil {
		t.Fatalf("after the release: %v", err)
	}
	if err := s.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, "c", 300<<20); err != nil {
		t.Fatalf("after a's removal, 300MiB fit again: %v", err)
	}
}

// TestFullNeighbourKeepsSyncedData is the data-loss case: one sandbox fills
// its disk; the other's synced write survives an unmount and mount (a stop
// and start), and the filler gets ENOSPC from its own filesystem.
func TestFullNeighbourKeepsSyncedData(t *testing.T) {
	s := newStore(t, 1<<30)
	ctx := context.Background()
	// Bounds that, summed, would overfill the store if it thin-provisioned.
	if err := s.Create(ctx, "filler", 200<<20); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, "quiet", 200<<20); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, "third", 400<<20); err != nil {
		t.Fatal(err)
	}
	wantNoSpace(t, s.Create(ctx, "over", 300<<20), "a sandbox over the store's size")
	for _, id := range []string{"filler", "quiet"} {
		if err := s.attach(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	data := bytes.Repeat([]byte("acknowledged "), 1<<20) // 13 MiB
	quiet := filepath.Join(s.upper("quiet"), "keep")
	writeSync := func(path string, b []byte) error {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if _, err := f.Write(b); err != nil {
			f.Close()
			return err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	// The filler writes until its own filesystem says it is full.
	f, err := os.Create(filepath.Join(s.upper("filler"), "fill"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*7 + 1) // not zeroes
	}
	var werr error
	for i := 0; i < 1024 && werr == nil; i++ {
		_, werr = f.Write(chunk)
		if i == 50 {
			if err := writeSync(quiet, data); err != nil {
				t.Fatalf("the neighbour's write: %v", err)
			}
		}
	}
	if werr == nil {
		werr = f.Sync()
	}
	f.Close()
	if !errors.Is(werr, unix.ENOSPC) {
		t.Fatalf("the filler's write past its disk: %v, want ENOSPC", werr)
	}
	for _, id := range []string{"filler", "quiet"} {
		if err := s.Detach(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.attach(ctx, "quiet"); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(quiet)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the neighbour's synced file after a remount: %d bytes, %v; want its %d bytes", len(got), err, len(data))
	}
}

// TestTemplatesBounded: every disk size asked for makes a template; only the
// most recently used few are kept.
func TestTemplatesBounded(t *testing.T) {
	s := newStore(t, 1<<30)
	ctx := context.Background()
	for i := range maxTemplates + 4 {
		id := fmt.Sprintf("t%d", i)
		if err := s.Create(ctx, id, int64(16+i)<<20); err != nil {
			t.Fatal(err)
		}
		if err := s.Remove(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := s.TemplateUsage(); n != maxTemplates {
		t.Errorf("%d templates kept, want %d", n, maxTemplates)
	}
}

// TestOpenRemovesHalfMadeFiles: the .tmp files a crash left in the store
// (a copy or mkfs cut short) are removed when the store is opened again;
// whole files stay.
func TestOpenRemovesHalfMadeFiles(t *testing.T) {
	s := newStore(t, 1<<30)
	half := []string{"saved/ck-0123456789ab.img.tmp", "sandboxes/0123456789ab.img.tmp", "templates/ext4-1.img.tmp"}
	whole := "saved/ck-ba9876543210.img"
	for _, f := range append(half, whole) {
		if err := os.WriteFile(filepath.Join(s.dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := Unmount(s.dir); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(context.Background(), Options{Dir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range half {
		if _, err := os.Stat(filepath.Join(s2.dir, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after a reopen: %v, want it removed", f, err)
		}
	}
	if _, err := os.Stat(filepath.Join(s2.dir, whole)); err != nil {
		t.Errorf("%s after a reopen: %v, want it kept", whole, err)
	}
}

// TestStoreGrows: a store that starts small grows, online and in steps, when
// a sandbox does not fit in it but fits on the host; sandboxes made before
// keep their files; it stops at its ceiling and at the host's reserve, and
// a refusal says which.
func TestStoreGrows(t *testing.T) {
	testenv.RequireRoot(t, "loop-mounts an XFS store")
	dir := t.TempDir()
	// The host's free space is faked: what the test allocates is its own
	// few hundred MiB, whatever the host has.
	var hostFree atomic.Int64
	hostFree.Store(2 << 30)
	host := hostdisk.New(dir, 512<<20).WithStatfs(func(string) (hostdisk.Space, error) {
		return hostdisk.Space{Avail: uint64(hostFree.Load()), Total: 100 << 30}, nil
	})
	ctx := context.Background()
	s, err := Open(ctx, Options{Dir: filepath.Join(dir, "storage"), Size: 320 << 20, Host: host, Max: 1 << 30, Step: 128 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ids, _ := s.List()
		for _, id := range ids {
			s.Remove(ctx, id)
		}
		Unmount(s.dir)
	})
	if size, _ := s.Size(); size != 320<<20 {
		t.Fatalf("first size %d, want 320MiB", size)
	}
	if err := s.Create(ctx, "a", 128<<20); err != nil {
		t.Fatal(err)
	}
	if err := s.attach(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	keep := bytes.Repeat([]byte("before the growth "), 1<<16)
	if err := os.WriteFile(filepath.Join(s.upper("a"), "keep"), keep, 0o644); err != nil {
		t.Fatal(err)
	}
	before, _ := s.Space()
	if err := s.Create(ctx, "b", 256<<20); err != nil {
		t.Fatalf("a create the store must grow for: %v", err)
	}
	after, _ := s.Space()
	size, _ := s.Size()
	if after.Capacity <= before.Capacity || size < 320<<20+128<<20 {
		t.Fatalf("after the growth: capacity %d (was %d), image %d", after.Capacity, before.Capacity, size)
	}
	if got, err := os.ReadFile(filepath.Join(s.upper("a"), "keep")); err != nil || !bytes.Equal(got, keep) {
		t.Fatalf("a's file after the growth: %d bytes, %v", len(got), err)
	}
	// The ceiling: 1GiB in all.
	err = s.Create(ctx, "huge", 900<<20)
	wantNoSpace(t, err, "a sandbox past --storage-max")
	if !strings.Contains(err.Error(), "--storage-max") {
		t.Errorf("refusal at the ceiling: %v, want it to name --storage-max", err)
	}
	// The host's reserve: with 600MiB free and 512MiB kept, it grows by no more than 88MiB.
	hostFree.Store(600 << 20)
	err = s.Create(ctx, "c", 300<<20)
	wantNoSpace(t, err, "a sandbox the host's reserve leaves no room for")
	if !strings.Contains(err.Error(), "--reserve") {
		t.Errorf("refusal at the reserve: %v, want it to name --reserve", err)
	}
	// A reopened store keeps its grown size.
	if err := s.Detach("a"); err != nil {
		t.Fatal(err)
	}
	if err := Unmount(s.dir); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(ctx, Options{Dir: s.dir, Host: host, Max: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	s = s2
	if sp, _ := s.Space(); sp.Capacity != after.Capacity {
		t.Errorf("capacity after a reopen %d, want %d", sp.Capacity, after.Capacity)
	}
}
