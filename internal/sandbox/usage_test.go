package sandbox

import (
	"os"
	"path/filepath"
	"testing"
)

// The store's image is the sandboxes' disks: shard df shows it as the store,
// and counting it as the server's own too once put 16GiB under "server".
func TestDiskUsageLeavesTheStoreOut(t *testing.T) {
	f := newFakeService(t)
	img := filepath.Join(f.svc.cfg.DataDir, "storage.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(f.svc.cfg.DataDir, "some.db")
	if err := os.WriteFile(db, make([]byte, 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	server := func() int64 {
		u, err := f.svc.Admission().DiskUsage(own())
		if err != nil {
			t.Fatal(err)
		}
		return u.Server.Bytes
	}
	with := server()
	f.fs.backing = img
	without := server()
	if with-without < 1<<20 {
		t.Fatalf("server bytes %d with the store's image counted, %d without: want the image's MiB left out", with, without)
	}
	if without < 64<<10 {
		t.Fatalf("server bytes %d: the server's own files are not counted", without)
	}
}
