package rootfs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestIsMountPoint: statx's answer is the mount table's.
func TestIsMountPoint(t *testing.T) {
	dir := t.TempDir()
	paths := map[string]bool{"/": true, "/proc": true, dir: false, filepath.Join(dir, "none"): false}
	if os.Geteuid() == 0 {
		m := filepath.Join(dir, "m")
		os.Mkdir(m, 0o755)
		if err := unix.Mount("tmpfs", m, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(m, unix.MNT_DETACH) })
		os.Mkdir(filepath.Join(m, "sub"), 0o755)
		paths[m], paths[filepath.Join(m, "sub")] = true, false
	}
	for p, want := range paths {
		got, err := isMountPoint(p)
		if err != nil || got != want {
			t.Errorf("isMountPoint(%s) = %v, %v; want %v", p, got, err, want)
		}
		if table, _ := isMountPointByTable(p); table != want {
			t.Errorf("isMountPointByTable(%s) = %v, want %v", p, table, want)
		}
	}
}

func BenchmarkIsMountPoint(b *testing.B) {
	dir := b.TempDir()
	b.Run("statx", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			isMountPoint(dir)
		}
	})
	b.Run("mountinfo", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			isMountPointByTable(dir)
		}
	})
}
