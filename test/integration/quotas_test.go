package integration

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

func wantQuota(t *testing.T, what string, err error, says ...string) {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != 403 || ce.Code != "quota_exceeded" {
		t.Fatalf("%s: %v, want 403 quota_exceeded", what, err)
	}
	for _, s := range says {
		if !strings.Contains(ce.Message, s) {
			t.Errorf("%s: %q, want it to say %q", what, ce.Message, s)
		}
	}
}

// TestProjectQuotas, on real runsc and runc: project qa, bounded to two
// sandboxes, 768MiB of running memory and a few bytes of saved state, is
// refused a third sandbox, a fork of two (none made), a start past its
// memory, a checkpoint and a snapshot past its saved bytes, and an exec
// once its ledger is at its bound; each refusal names the bound, the use
// and the limit. Project qb, with no quota, creates and runs meanwhile.
// project ls shows qa's use against its quota.
func TestProjectQuotas(t *testing.T) {
	e := need(t)
	ctx := ctxT(t)
	qa, qb := projectClient(t, "qa"), projectClient(t, "qb")
	set := func(q client.ProjectQuota) {
		t.Helper()
		if _, err := e.c.SetProjectQuota(ctx, "qa", q); err != nil {
			t.Fatal(err)
		}
	}
	set(client.ProjectQuota{MaxSandboxes: 2, MaxMemoryBytes: 768 << 20})
	t.Cleanup(func() { e.c.SetProjectQuota(context.Background(), "qa", client.ProjectQuota{}) })
	mem := func(n int64) json.RawMessage { return json.RawMessage(strconv.FormatInt(n<<20, 10)) }
	a1, err := qa.Create(ctx, client.CreateRequest{Image: busybox, Name: "qa-1", Provider: "gvisor", Memory: mem(512)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qa.Remove(context.Background(), "qa-1", true) })
	a2, err := qa.Create(ctx, client.CreateRequest{Image: busybox, Name: "qa-2", Provider: "runc", Memory: mem(256)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qa.Remove(context.Background(), "qa-2", true) })
	_, err = qa.Create(ctx, client.CreateRequest{Image: busybox, Name: "qa-3", Memory: mem(32)})
	wantQuota(t, "a third sandbox", err, "qa", "sandboxes is 2", "holds 2", "--max-sandboxes")
	set(client.ProjectQuota{MaxSandboxes: 3, MaxMemoryBytes: 768 << 20})
	_, err = qa.ForkMany(ctx, a1.ID, client.ForkRequest{Name: "qa-kid", Count: 2})
	wantQuota(t, "a fork of two", err, "sandboxes")
	_, err = qa.Fork(ctx, a1.ID, client.ForkRequest{Name: "qa-kid"})
	wantQuota(t, "a fork past the memory", err, "memory of running sandboxes is 768MiB", "holds 768MiB", "--max-memory")
	// Project qb is bounded by nothing of qa's.
	b1, err := qb.Create(ctx, client.CreateRequest{Image: busybox, Name: "qb-1", Memory: mem(1024)})
	if err != nil {
		t.Fatalf("qb's create beside qa at its quota: %v", err)
	}
	t.Cleanup(func() { qb.Remove(context.Background(), "qb-1", true) })
	if res, err := qb.Exec(ctx, b1.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("qb's exec: %v %+v", err, res)
	}
	// A stopped sandbox frees its memory; a start counts it again.
	if _, err := qa.Stop(ctx, a2.ID); err != nil {
		t.Fatal(err)
	}
	a3, err := qa.Create(ctx, client.CreateRequest{Image: busybox, Name: "qa-3", Provider: "runc", Memory: mem(256)})
	if err != nil {
		t.Fatalf("qa-3 in the memory qa-2 gave back: %v", err)
	}
	t.Cleanup(func() { qa.Remove(context.Background(), "qa-3", true) })
	_, err = qa.Start(ctx, a2.ID)
	wantQuota(t, "a start past the memory", err, "memory")
	// Saved bytes: a checkpoint's memory image and a snapshot are refused
	// past them.
	set(client.ProjectQuota{MaxSavedBytes: 1})
	_, err = qa.Checkpoint(ctx, a1.ID, client.CheckpointRequest{})
	wantQuota(t, "a checkpoint past the saved bytes", err, "saved bytes", "--max-saved-bytes")
	_, err = qa.CreateSnapshot(ctx, client.SnapshotRequest{Sandbox: a2.ID, Name: "qa-snap"})
	wantQuota(t, "a snapshot past the saved bytes", err, "saved bytes")
	// Ledger bytes: at its bound, an exec adds nothing and is refused.
	ps, err := e.c.Projects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var use client.ProjectUse
	for _, p := range ps {
		if p.Name == "qa" {
			use = p.Use
		}
	}
	if use.Sandboxes != 3 || use.MemoryBytes != 768<<20 || use.LedgerBytes <= 0 {
		t.Fatalf("qa's use %+v, want 3 sandboxes, 768MiB running and some ledger", use)
	}
	set(client.ProjectQuota{MaxLedgerBytes: use.LedgerBytes})
	_, err = qa.Exec(ctx, a3.ID, client.ExecRequest{Argv: []string{"true"}})
	wantQuota(t, "an exec at the ledger bound", err, "ledger", "--max-ledger-bytes", "shard ledger rm")
	if res, err := qb.Exec(ctx, b1.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("qb's exec while qa is at its ledger bound: %v %+v", err, res)
	}
	// A project's key cannot set quotas, its own or another's.
	key := projectToken(t, "qa-admin", "qa", "*")
	code, ce, _ := projCall(t, "PUT", "/v0/projects/qa/quota", key, "", []byte(`{}`))
	if code != 403 || ce.Code != "wrong_project" {
		t.Fatalf("a project's key setting its quota: %d %+v, want 403 wrong_project", code, ce)
	}
	// Removing the quota lets qa go on.
	set(client.ProjectQuota{})
	if res, err := qa.Exec(ctx, a3.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("qa's exec with no quota: %v %+v", err, res)
	}
}

// TestHostMemoryAdmission: the memory bounds of running sandboxes stay
// within the host's memory (overcommit 1.0, the default): a sandbox asking
// for 3/5 of it runs, a second is 507 insufficient_memory saying what is
// promised, and fits once the first stops. The bounds are cgroup limits,
// not memory used: the test takes nothing of the host's.
func TestHostMemoryAdmission(t *testing.T) {
	e := need(t)
	ctx := ctxT(t)
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	var kb int64
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	if kb == 0 {
		t.Fatal("no MemTotal in /proc/meminfo")
	}
	big := (kb << 10) / 5 * 3 &^ (1<<20 - 1)
	m1, err := e.c.Create(ctx, client.CreateRequest{Image: busybox, Name: "mem-1", Provider: "runc", Memory: json.RawMessage(strconv.FormatInt(big, 10))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), "mem-1", true) })
	_, err = e.c.Create(ctx, client.CreateRequest{Image: busybox, Name: "mem-2", Provider: "gvisor", Memory: json.RawMessage(strconv.FormatInt(big, 10))})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != 507 || ce.Code != "insufficient_memory" || !strings.Contains(ce.Message, "--memory-overcommit") {
		t.Fatalf("a second sandbox of 3/5 of the host's memory: %v, want 507 insufficient_memory naming --memory-overcommit", err)
	}
	if _, err := e.c.Get(ctx, "mem-2"); err == nil {
		t.Fatal("a refused create left a sandbox")
	}
	if _, err := e.c.Stop(ctx, m1.ID); err != nil {
		t.Fatal(err)
	}
	m2, err := e.c.Create(ctx, client.CreateRequest{Image: busybox, Name: "mem-2", Provider: "gvisor", Memory: json.RawMessage(strconv.FormatInt(big, 10))})
	if err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), "mem-2", true) })
	execOK(t, m2.ID, "true")
	_, err = e.c.Start(ctx, m1.ID)
	if !errors.As(err, &ce) || ce.Status != 507 || ce.Code != "insufficient_memory" {
		t.Fatalf("a start past the host's memory: %v, want 507 insufficient_memory", err)
	}
}
