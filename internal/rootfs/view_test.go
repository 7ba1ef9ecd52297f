package rootfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestViewGivenUpLeavesNothing: a view whose caller gives up (a diff's
// client that leaves) while mount(8) runs leaves no mount behind, even when
// the kernel's mount was done before the caller gave up and mount(8) had
// not returned yet. mount here is the real one followed by a pause, so the
// caller gives up after the mount was made, every time.
func TestViewGivenUpLeavesNothing(t *testing.T) {
	s := newStore(t, 1<<30)
	ctx := context.Background()
	if err := s.Create(ctx, "a", 64<<20); err != nil {
		t.Fatal(err)
	}
	real, err := exec.LookPath("mount")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	script := "#!/bin/sh\n" + real + " \"$@\" || exit\nsleep 1\n"
	if err := os.WriteFile(filepath.Join(bin, "mount"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))

	dir := filepath.Join(t.TempDir(), "view")
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	release, err := s.View(cctx, "a", "", dir)
	if err == nil {
		release()
		t.Fatal("a view whose context ended while it was mounted was made")
	}
	if m, _ := isMountPoint(dir); m {
		Unmount(dir)
		t.Fatalf("a view given up (%v) is left mounted at %s", err, dir)
	}
	ents, _ := os.ReadDir(filepath.Join(s.dir, "saved"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "view-") {
			t.Errorf("a view given up left its copy %s", e.Name())
		}
	}
}
