package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// runscContainers is runsc's list of the shared server's containers: id →
// status (created: a sandbox made ahead, or one being made).
func runscContainers(t testing.TB) map[string]string {
	t.Helper()
	out, err := exec.Command("runsc", "--root", filepath.Join(need(t).runDir, "runsc"), "list", "--format", "json").Output()
	if err != nil {
		t.Fatalf("runsc list: %v", err)
	}
	var cs []struct{ ID, Status string }
	if err := json.Unmarshal(out, &cs); err != nil {
		t.Fatalf("runsc list: %v: %s", err, out)
	}
	m := map[string]string{}
	for _, c := range cs {
		m[c.ID] = c.Status
	}
	return m
}

// madeAhead waits until n of runsc's containers are created and owned by
// no record (sandboxes made ahead), and returns their ids.
func madeAhead(t testing.TB, n int) []string {
	t.Helper()
	e := need(t)
	for i := 0; ; i++ {
		all, err := e.c.List(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for id, st := range runscContainers(t) {
			if st == "created" && !slices.ContainsFunc(all, func(sb client.Sandbox) bool { return sb.ID == id }) {
				ids = append(ids, id)
			}
		}
		if len(ids) == n {
			return ids
		}
		if i == 300 {
			t.Fatalf("%d sandboxes made ahead %v after 30s, want %d", len(ids), ids, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestForkAhead (gvisor): with --ahead, a fork and a restore restore into
// a runtime sandbox created before they were asked for (its id is the
// fork's), and the fork is a fork like any: its own hostname, identity,
// address and files, its source's processes counting on; more forks at
// once than are made ahead are created; a stop and start keep its files;
// and a kill -9 of the server leaves no sandbox made ahead behind.
func TestForkAhead(t *testing.T) {
	e := need(t)
	restartWith(t, "--ahead", "2")
	ctx := ctxT(t)
	src := create(t, client.CreateRequest{Image: busybox, Name: "ahead-src", Memory: jsonRaw("256MiB")})
	execOK(t, src.ID, "sh", "-c", "n=0; while :; do n=$((n+1)); echo $n > /tmp/count; sleep 0.05; done >/dev/null 2>&1 &")
	execOK(t, src.ID, "sh", "-c", "echo src > /srv-file")
	first, err := e.c.Fork(ctx, src.ID, client.ForkRequest{Name: "ahead-first"})
	if err != nil {
		t.Fatal(err)
	}
	ahead := madeAhead(t, 2) // its shape is known now

	before, _ := strconv.Atoi(strings.TrimSpace(execOK(t, src.ID, "cat", "/tmp/count")))
	fk, err := e.c.Fork(ctx, src.ID, client.ForkRequest{Name: "ahead-second"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ahead, fk.ID) {
		t.Fatalf("fork %s restored into a sandbox created for it, not into one made ahead %v", fk.ID, ahead)
	}
	if got := strings.TrimSpace(execOK(t, fk.ID, "hostname")); got != "ahead-second" {
		t.Errorf("the fork's hostname %q, want ahead-second (the sandbox made ahead had its id)", got)
	}
	if got := strings.TrimSpace(execOK(t, fk.ID, "cat", "/etc/hostname")); got != "ahead-second" {
		t.Errorf("the fork's /etc/hostname %q", got)
	}
	if id := identityOf(t, fk.ID); id.ID != fk.ID || id.Name != "ahead-second" || id.ParentID != src.ID {
		t.Errorf("the fork's /run/shard/fork %+v", id)
	}
	if fk.IP == "" || fk.IP == src.IP || fk.IP == first.IP {
		t.Errorf("the fork's address %q (source %s, first fork %s)", fk.IP, src.IP, first.IP)
	}
	if n, _ := strconv.Atoi(strings.TrimSpace(execOK(t, fk.ID, "cat", "/tmp/count"))); n < before {
		t.Errorf("the fork's count %d, below the source's %d before the fork", n, before)
	}
	if out := execOK(t, fk.ID, "cat", "/srv-file"); out != "src\n" {
		t.Errorf("the fork's /srv-file %q, want the source's", out)
	}
	execOK(t, fk.ID, "sh", "-c", "echo fork > /srv-file && touch /fork-only")
	if out := execOK(t, src.ID, "sh", "-c", "cat /srv-file; ls /fork-only 2>&1 || true"); !strings.HasPrefix(out, "src\n") || !strings.Contains(out, "No such file") {
		t.Errorf("the source sees the fork's files: %q", out)
	}

	// A stop and a start mount its files again (the placeholder under them
	// is gone), and keep them.
	if _, err := e.c.Stop(ctx, fk.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Start(ctx, fk.ID); err != nil {
		t.Fatal(err)
	}
	if out := execOK(t, fk.ID, "cat", "/srv-file"); out != "fork\n" {
		t.Errorf("after a stop and start the fork's /srv-file %q", out)
	}

	// More at once than are made ahead: the two made ahead, one created.
	ahead = madeAhead(t, 2)
	forks, err := e.c.ForkMany(ctx, src.ID, client.ForkRequest{Name: "ahead-kid", Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	took := 0
	for _, k := range forks {
		if slices.Contains(ahead, k.ID) {
			took++
		}
		if got := strings.TrimSpace(execOK(t, k.ID, "hostname")); got != k.Name {
			t.Errorf("fork %s's hostname %q", k.Name, got)
		}
	}
	if took != 2 {
		t.Errorf("%d of 3 forks took a sandbox made ahead, want 2", took)
	}

	// A restore takes one too (the shape now keeps 3).
	ahead = madeAhead(t, 3)
	back, err := e.c.Restore(ctx, fk.Origin.Checkpoint, client.RestoreRequest{Name: "ahead-back"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ahead, back.ID) {
		t.Errorf("restore %s, not into a sandbox made ahead %v", back.ID, ahead)
	}
	if got := strings.TrimSpace(execOK(t, back.ID, "hostname")); got != "ahead-back" {
		t.Errorf("the restored sandbox's hostname %q", got)
	}
	madeAhead(t, 3)

	// kill -9: the sandboxes made ahead have no record; the next start
	// removes them, their mounts and namespaces.
	e.killServer()
	if err := e.startServer(); err != nil {
		t.Fatal(err)
	}
	all, err := e.c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	owned := func(id string) bool {
		return slices.ContainsFunc(all, func(sb client.Sandbox) bool { return sb.ID == id })
	}
	for id, st := range runscContainers(t) {
		if !owned(id) {
			t.Errorf("after kill -9 and a start, runsc holds %s (%s), which no record owns", id, st)
		}
	}
	for _, m := range e.sandboxMounts() {
		if rel, err := filepath.Rel(filepath.Join(e.dataDir, "run"), m); err == nil && !strings.HasPrefix(rel, "..") {
			if id, _, _ := strings.Cut(rel, "/"); !owned(id) {
				t.Errorf("after kill -9 and a start, %s is mounted, of no record", m)
			}
		}
	}
	if ents, err := os.ReadDir(filepath.Join(e.dataDir, "run")); err == nil {
		for _, d := range ents {
			if d.IsDir() && is12hex(d.Name()) && !owned(d.Name()) {
				t.Errorf("after kill -9 and a start, run directory %s is left, of no record", d.Name())
			}
		}
	}
	for _, sb := range all {
		if strings.HasPrefix(sb.Name, "ahead-") {
			if err := e.c.Remove(ctx, sb.ID, true); err != nil {
				t.Error(err)
			}
		}
	}
}
