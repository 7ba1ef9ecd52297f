package integration

// What projects share: the server's addresses and its sandbox limit, and
// the names of imported images (each project its own). These began as a
// red team's reproductions, each of which failed on the first projects.

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

func projectClient(t *testing.T, proj string) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{Socket: need(t).socket, Project: proj})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestProjectsShareAddresses: every address is unique among all projects,
// after a restart too (which starts allocation from the bottom of the
// subnet again). When allocation listed the request's project only, pb's
// sandbox was given pa's address: pa's execs (their env with pa's granted
// secret, and pa's agent token) went to pb's sandbox, where root with
// CAP_NET_RAW read them off its eth0.
func TestProjectsShareAddresses(t *testing.T) {
	e := need(t)
	ctx := ctxT(t)
	pa, pb := projectClient(t, "red-a"), projectClient(t, "red-b")
	if _, err := pa.SetSecret(ctx, "red-secret", []byte("pa-value")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pa.RemoveSecret(context.Background(), "red-secret") })
	a, err := pa.Create(ctx, client.CreateRequest{Image: busybox, Name: "red-a1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pa.Remove(context.Background(), a.ID, true) })
	if _, err := pa.Grant(ctx, a.ID, client.Grant{Secret: "red-secret", Env: "RED"}); err != nil {
		t.Fatal(err)
	}
	e.stopServer()
	if err := e.startServer(); err != nil {
		t.Fatal(err)
	}
	// pb makes a few: the first ones after a restart start from the
	// bottom of the subnet again, skipping only pb's own addresses.
	taken := map[string]string{}
	all, err := e.c.ListAllProjects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range all {
		if sb.IP != "" {
			taken[sb.IP] = sb.Project + "/" + sb.Name
		}
	}
	for i := 0; i < 3; i++ {
		b, err := pb.Create(ctx, client.CreateRequest{Image: busybox, Name: "red-b" + strconv.Itoa(i)})
		if err != nil { // an address collision can also show as "agent did not answer"
			t.Errorf("pb's create %d: %v", i, err)
			continue
		}
		t.Cleanup(func() { pb.Remove(context.Background(), b.ID, true) })
		if who, ok := taken[b.IP]; ok {
			t.Errorf("pb's %s was given %s, the address of %s", b.Name, b.IP, who)
		}
		taken[b.IP] = "pb/" + b.Name
	}
	res, err := pa.Exec(ctx, a.ID, client.ExecRequest{Argv: []string{"sh", "-c", "echo $RED"}})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "pa-value" {
		t.Errorf("pa's exec after pb's creates: %+v, %v", res, err)
	}
}

// TestProjectsShareSandboxLimit: --max-sandboxes is the server's, counted
// over every project (it was each project's, so each got the whole limit).
func TestProjectsShareSandboxLimit(t *testing.T) {
	e := need(t)
	ctx := ctxT(t)
	pa := projectClient(t, "red-a")
	a, err := pa.Create(ctx, client.CreateRequest{Image: busybox, Name: "red-limit-a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pa.Remove(context.Background(), a.ID, true) })
	all, err := e.c.ListAllProjects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	limit := len(all) + 1 // pa's sandbox is one of them
	restartWith(t, "--max-sandboxes", strconv.Itoa(limit))
	pb := projectClient(t, "red-limit")
	for i := 0; i < 2; i++ {
		b, err := pb.Create(ctx, client.CreateRequest{Image: busybox, Name: "red-limit" + strconv.Itoa(i)})
		if err == nil {
			t.Cleanup(func() { pb.Remove(context.Background(), b.ID, true) })
		}
		if i == 1 {
			if ce, ok := err.(*client.Error); !ok || ce.Code != "sandbox_limit" {
				t.Errorf("create %d past --max-sandboxes %d (every project counted): %v", len(all)+2, limit, err)
			}
		}
	}
}

// TestImportsStayInTheirProject: an import is named under localhost/ and
// belongs to its project: pb importing pa's name makes pb's own and leaves
// pa's as it was; an import under a registry's name (busybox:latest, which
// pa's creates pull) is refused, so it cannot plant what pa runs.
func TestImportsStayInTheirProject(t *testing.T) {
	ctx := ctxT(t)
	pa, pb := projectClient(t, "red-a"), projectClient(t, "red-b")
	const ref = "localhost/red/shared:1"
	ia, err := pa.ImportImage(ctx, bytes.NewReader(dockerSaveAs(t, ref, []byte("pa's"))), ref)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pa.RemoveImage(context.Background(), ref) })
	ib, err := pb.ImportImage(ctx, bytes.NewReader(dockerSaveAs(t, ref, []byte("pb's"))), ref)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pb.RemoveImage(context.Background(), ref) })
	if ia[0].Digest == ib[0].Digest {
		t.Fatalf("the two imports have one digest: the test proves nothing")
	}
	for _, c := range []struct {
		c    *client.Client
		want string
	}{{pa, ia[0].Digest}, {pb, ib[0].Digest}} {
		if got, err := c.c.Image(ctx, ref); err != nil || got.Digest != c.want {
			t.Errorf("%s after both imports: %+v, %v; want digest %s", ref, got, err, c.want)
		}
	}
	_, err = pb.ImportImage(ctx, bytes.NewReader(dockerSaveAs(t, "busybox:latest", []byte("planted"))), "busybox:latest")
	if ce, ok := err.(*client.Error); !ok || ce.Status != 400 {
		t.Errorf("pb's import as busybox:latest: %v, want a 400", err)
	}
	if out := execOK(t, create(t, client.CreateRequest{Image: busybox}).ID, "sh", "-c", "test ! -e /data && echo clean"); strings.TrimSpace(out) != "clean" {
		t.Errorf("a create of busybox after pb's try runs %q", out)
	}
}
