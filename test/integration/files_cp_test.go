package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

// TestFilesCopyFollowsDirLink: as docker cp, a sandbox path that ends in
// / or /. and names a symlink to a directory copies the directory (its
// contents with /.), both ways, running and stopped; without them the
// link is copied as a link. The link is resolved in the sandbox's root:
// one to a path that is a directory on the host too copies the sandbox's.
func TestFilesCopyFollowsDirLink(t *testing.T) {
	e := need(t)
	hostDir := t.TempDir()
	os.WriteFile(filepath.Join(hostDir, "marker"), []byte("host"), 0o644)
	os.WriteFile(filepath.Join(hostDir, "host-only"), []byte("host"), 0o644)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "files-dirlink-" + prov})
			execOK(t, sb.ID, "sh", "-c", "mkdir -p /t/real/sub /t/inreal "+hostDir+" && echo a > /t/real/a && echo b > /t/real/sub/b && ln -s real /t/lnkdir && ln -s inreal /t/lnkin && "+
				"echo sandbox > "+hostDir+"/marker && ln -s "+hostDir+" /t/hostlnk")
			run := func(args ...string) {
				t.Helper()
				if _, errOut, code := e.cli(t, "", args...); code != 0 {
					t.Fatalf("shard %v: exit %d: %s", args, code, errOut)
				}
			}
			for _, state := range []string{"running", "stopped"} {
				if state == "stopped" {
					if _, err := e.c.Stop(ctxT(t), sb.ID); err != nil {
						t.Fatal(err)
					}
				}
				local := t.TempDir()
				// /. : the contents of the directory the link names.
				run("cp", sb.Name+":/t/lnkdir/.", filepath.Join(local, "x"))
				wantTree(t, state+" lnkdir/.", filepath.Join(local, "x"), "a=a\nsub/b=b\n")
				// / : the directory, under the link's name.
				os.Mkdir(filepath.Join(local, "y"), 0o755)
				run("cp", sb.Name+":/t/lnkdir/", filepath.Join(local, "y"))
				wantTree(t, state+" lnkdir/", filepath.Join(local, "y"), "lnkdir/a=a\nlnkdir/sub/b=b\n")
				// Neither: the link itself.
				run("cp", sb.Name+":/t/lnkdir", filepath.Join(local, "z"))
				if l, err := os.Readlink(filepath.Join(local, "z")); err != nil || l != "real" {
					t.Fatalf("%s: lnkdir copied as %q %v, want the symlink", state, l, err)
				}
				// The sandbox's directory at the host's path, never the host's.
				run("cp", sb.Name+":/t/hostlnk/.", filepath.Join(local, "w"))
				wantTree(t, state+" hostlnk/.", filepath.Join(local, "w"), "marker=sandbox\n")
				// In: through the link into the directory it names.
				os.WriteFile(filepath.Join(local, "in-"+state), []byte(state+"\n"), 0o644)
				run("cp", filepath.Join(local, "in-"+state), sb.Name+":/t/lnkin/")
				run("cp", filepath.Join(local, "x")+"/.", sb.Name+":/t/lnkin/.")
			}
			if _, err := e.c.Start(ctxT(t), sb.ID); err != nil {
				t.Fatal(err)
			}
			if got := execOK(t, sb.ID, "sh", "-c", "readlink /t/lnkin; cat /t/inreal/in-running /t/inreal/in-stopped; ls /t/inreal"); got != "inreal\nrunning\nstopped\na\nin-running\nin-stopped\nsub\n" {
				t.Fatalf("after the copies in: %q", got)
			}
			if b, err := os.ReadFile(filepath.Join(hostDir, "marker")); err != nil || string(b) != "host" {
				t.Fatalf("the host's marker: %q %v", b, err)
			}
		})
	}
}

// wantTree checks the regular files under dir (name=content lines, sorted)
// and that dir and what it holds are no symlinks.
func wantTree(t *testing.T, what, dir, want string) {
	t.Helper()
	var got strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("%s is a symlink", p)
		}
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			rel, _ := filepath.Rel(dir, p)
			fmt.Fprintf(&got, "%s=%s", rel, b)
		}
		return nil
	})
	if err != nil || got.String() != want {
		t.Fatalf("%s: %q %v, want %q", what, got.String(), err, want)
	}
}
