package integration

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

// TestImages: pull from the local registry, ls, import an OCI archive and a
// docker-archive, create from the imported image, rm.
func TestImages(t *testing.T) {
	e := need(t)
	ref := e.registry + "/busybox:latest"
	if _, errOut, code := e.cli(t, "", "image", "pull", ref); code != 0 {
		t.Fatalf("pull: %s", errOut)
	}
	out, _, _ := e.cli(t, "", "image", "ls")
	if !strings.Contains(out, ref) {
		t.Fatalf("image ls lacks %s:\n%s", ref, out)
	}
	for _, format := range []string{"oci-archive", "docker-archive"} {
		t.Run(format, func(t *testing.T) {
			tar := filepath.Join(t.TempDir(), "img.tar")
			cmd := exec.Command("skopeo", "copy", "--src-tls-verify=false", "docker://"+e.registry+"/busybox:latest", format+":"+tar)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("skopeo: %v\n%s", err, out)
			}
			name := "localhost/imported/" + format + ":v1"
			if _, errOut, code := e.cli(t, "", "image", "import", "--name", name, tar); code != 0 {
				t.Fatalf("import: %s", errOut)
			}
			sb := create(t, client.CreateRequest{Image: name})
			if got := execOK(t, sb.ID, "echo", "from-import"); got != "from-import\n" {
				t.Fatalf("exec in a sandbox from an imported image: %q", got)
			}
			e.c.Remove(ctxT(t), sb.ID, true)
			if _, errOut, code := e.cli(t, "", "image", "rm", name); code != 0 {
				t.Fatalf("rm: %s", errOut)
			}
			if _, _, code := e.cli(t, "", "image", "rm", name); code == 0 {
				t.Fatalf("second rm succeeded")
			}
		})
	}
}

// TestCapabilities: every provider listed, truthfully.
func TestCapabilities(t *testing.T) {
	e := need(t)
	caps, err := e.c.Capabilities(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct{ avail, fork bool }{
		"gvisor": {true, true}, "runc": {true, false}, "firecracker": {false, false}, "vz": {false, false}, "sysbox": {false, false}, // none that cannot run here claims fork
	}
	for _, c := range caps {
		w, ok := want[c.Name]
		if !ok {
			t.Errorf("unexpected provider %s", c.Name)
			continue
		}
		delete(want, c.Name)
		if c.Available != w.avail || c.Fork != w.fork {
			t.Errorf("%s: available %v fork %v; want %v %v", c.Name, c.Available, c.Fork, w.avail, w.fork)
		}
		if !c.Available && c.Reason == "" {
			t.Errorf("%s is unavailable without a reason", c.Name)
		}
	}
	for n := range want {
		t.Errorf("provider %s missing", n)
	}
	out, _, code := e.cli(t, "", "capabilities")
	if code != 0 || !strings.Contains(out, "gvisor (default)") {
		t.Errorf("shard capabilities:\n%s", out)
	}
}
