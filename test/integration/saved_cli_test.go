package integration

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

// TestSavedCLI drives the new verbs through the real CLI: snapshot, create
// --from-snapshot, checkpoint (+ ls), restore, ledger (ls and a session),
// resume, env create/ls/rm, create --env-from, df; and their errors (a clear
// message, a non-zero exit).
func TestSavedCLI(t *testing.T) {
	e := need(t)
	sh := func(args ...string) string { t.Helper(); return cliOK(t, args...) }
	fails := func(part string, args ...string) {
		t.Helper()
		_, errOut, code := e.cli(t, "", args...)
		if code == 0 || !strings.Contains(errOut, part) {
			t.Fatalf("shard %v: exit %d, stderr %q, want a failure saying %q", args, code, errOut, part)
		}
	}
	id := sh("create", "--name", "cli-src", busybox)
	t.Cleanup(func() {
		e.cli(t, "", "remove", "--force", "cli-src", "cli-from-snap", "cli-restored", "cli-resumed", "cli-warm")
	})
	sh("exec", id, "sh", "-c", "echo one > /root/one")
	fails("shard fork or shard checkpoint", "snapshot", "create", "cli-src")
	ck := sh("checkpoint", "--tag", "first", "cli-src")
	sh("exec", id, "sh", "-c", "echo two > /root/two")
	if out := sh("checkpoint", "ls", "cli-src"); !strings.Contains(out, ck) || !strings.Contains(out, "first") {
		t.Fatalf("checkpoint ls: %s", out)
	}
	if out := sh("restore", "--name", "cli-restored", ck); len(out) != 12 {
		t.Fatalf("restore printed %q, want an id", out)
	}
	if got := sh("exec", "cli-restored", "ls", "/root"); got != "one" {
		t.Fatalf("restored: %q", got)
	}
	sh("resume", "--name", "cli-resumed", "cli-src")
	if got := sh("exec", "cli-resumed", "ls", "/root"); strings.Join(strings.Fields(got), " ") != "one two" {
		t.Fatalf("resumed: %q", got)
	}
	out := sh("ledger", "cli-src")
	for _, want := range []string{"sandbox.created", "sandbox.exec_started", "sandbox.exec_finished", "sandbox.checkpoint_created", "first"} {
		if !strings.Contains(out, want) {
			t.Fatalf("ledger cli-src lacks %q:\n%s", want, out)
		}
	}
	if out := sh("ledger", "--json", "cli-src"); !strings.HasPrefix(out, `{"seq":`) {
		t.Fatalf("ledger --json: %s", out)
	}
	if out := sh("ledger", "ls"); !strings.Contains(out, "cli-src") || !strings.Contains(out, "cli-resumed") {
		t.Fatalf("ledger ls: %s", out)
	}
	fails("not found", "ledger", "no-such-session")

	sh("stop", "cli-src")
	snap := sh("snapshot", "create", "--name", "cli-snap", "cli-src")
	if len(snap) != 12 {
		t.Fatalf("snapshot create printed %q", snap)
	}
	t.Cleanup(func() { e.cli(t, "", "snapshot", "rm", "cli-snap") })
	if out := sh("snapshot", "ls"); !strings.Contains(out, "cli-snap") {
		t.Fatalf("snapshot ls: %s", out)
	}
	sh("create", "--name", "cli-from-snap", "--from-snapshot", "cli-snap")
	if got := sh("exec", "cli-from-snap", "cat", "/root/two"); got != "two" {
		t.Fatalf("from snapshot: %q", got)
	}
	sh("snapshot", "rm", "cli-snap")
	fails("not found", "snapshot", "inspect", "cli-snap")

	out = sh("env", "create", "cli-env", "--memory", "128MiB", busybox, "--", "sh", "-c", "echo ready > /root/ready")
	if !strings.Contains(out, "cli-env") || !strings.Contains(out, "built") {
		t.Fatalf("env create: %s", out)
	}
	t.Cleanup(func() { e.cli(t, "", "env", "rm", "cli-env") })
	if out := sh("env", "create", "cli-env", "--memory", "128MiB", busybox, "--", "sh", "-c", "echo ready > /root/ready"); !strings.Contains(out, "unchanged") {
		t.Fatalf("env create again: %s", out)
	}
	if out := sh("env", "ls"); !strings.Contains(out, "cli-env") {
		t.Fatalf("env ls: %s", out)
	}
	fails("leave out", "create", "--env-from", "cli-env", "--memory", "1GiB")
	sh("create", "--name", "cli-warm", "--env-from", "cli-env")
	if got := sh("exec", "cli-warm", "cat", "/root/ready"); got != "ready" {
		t.Fatalf("from env: %q", got)
	}
	fails("exited 3", "env", "create", "cli-bad", busybox, "--", "sh", "-c", "exit 3")
	if out := sh("df"); !strings.Contains(out, "checkpoints") || !strings.Contains(out, "environments") || !strings.Contains(out, "images") {
		t.Fatalf("df: %s", out)
	}
	sh("env", "rm", "cli-env")
	fails("not found", "env", "inspect", "cli-env")
}

// TestLedgerBySandbox: where a ledger session is asked for (shard ledger,
// shard resume, the API's session routes), a sandbox's name or id finds its
// session: a fork's, fork-PARENT-ID, by the fork's name; a removed
// sandbox's by its id. A live sandbox's name wins over a session's own
// (that of a removed sandbox of the same name), and one found by neither
// says what was tried and where sessions are listed.
func TestLedgerBySandbox(t *testing.T) {
	e := need(t)
	sh := func(args ...string) string { t.Helper(); return cliOK(t, args...) }
	t.Cleanup(func() { e.cli(t, "", "remove", "--force", "lg-src", "lg-kid", "lg-back", "lg-dup") })
	sh("create", "--name", "lg-src", "--provider", "gvisor", busybox)
	sh("exec", "lg-src", "sh", "-c", "echo one > /root/one")
	kid := sh("fork", "--name", "lg-kid", "lg-src")
	ss, err := e.c.GetSession(ctxT(t), "lg-kid")
	if err != nil || !strings.HasPrefix(ss.Name, "fork-lg-src-") || ss.SandboxID != kid {
		t.Fatalf("GET /v0/ledger/sessions/lg-kid: %+v, %v; want the fork's session fork-lg-src-...", ss, err)
	}
	for _, ref := range []string{"lg-kid", kid, ss.Name} {
		if out := sh("ledger", "--json", ref); !strings.Contains(out, `"session":"`+ss.Name+`"`) || !strings.Contains(out, "sandbox.created") {
			t.Fatalf("shard ledger %s:\n%s", ref, out)
		}
	}
	sh("exec", "lg-kid", "sh", "-c", "echo two > /root/two")
	sh("resume", "--name", "lg-back", "lg-kid")
	if got := strings.Join(strings.Fields(sh("exec", "lg-back", "ls", "/root")), " "); got != "one two" {
		t.Fatalf("resumed from the fork's name: /root has %q", got)
	}
	// Removed, the fork is found by its id only (its name may be taken
	// again).
	sh("remove", "--force", "lg-kid")
	if out := sh("ledger", kid); !strings.Contains(out, "sandbox.removed") {
		t.Fatalf("shard ledger of a removed fork's id:\n%s", out)
	}
	_, errOut, code := e.cli(t, "", "ledger", "lg-kid")
	if code == 0 || !strings.Contains(errOut, "lg-kid") || !strings.Contains(errOut, "sandbox of that name or id") || !strings.Contains(errOut, "shard ledger ls") {
		t.Fatalf("shard ledger of a removed sandbox's name: exit %d, %q; want a failure naming what was tried and shard ledger ls", code, errOut)
	}
	// The sandbox lg-dup of now (its session lg-dup-2) wins over the
	// session lg-dup of a removed one, which its id still finds.
	first := sh("create", "--name", "lg-dup", "--provider", "runc", busybox)
	sh("remove", "--force", "lg-dup")
	second := sh("create", "--name", "lg-dup", "--provider", "runc", busybox)
	for _, tc := range []struct{ ref, session, not string }{{"lg-dup", "lg-dup-2", first}, {second, "lg-dup-2", first}, {first, "lg-dup", second}} {
		if out := sh("ledger", "--json", tc.ref); !strings.Contains(out, `"session":"`+tc.session+`"`) || strings.Contains(out, tc.not) {
			t.Fatalf("shard ledger %s shows another session than %s:\n%s", tc.ref, tc.session, out)
		}
	}
	e.cli(t, "", "remove", "--force", "lg-dup")
	sh("ledger", "rm", first)
	if ss, err := e.c.GetSession(ctxT(t), "lg-dup"); err == nil {
		t.Fatalf("shard ledger rm by a removed sandbox's id left its session: %+v", ss)
	}
	if _, err := e.c.GetSession(ctxT(t), "lg-dup-2"); err != nil {
		t.Fatalf("shard ledger rm %s took another session: %v", first, err)
	}
}

// cliOK runs the CLI and returns its stdout, trimmed; a failure fails t.
func cliOK(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := need(t).cli(t, "", args...)
	if code != 0 {
		t.Fatalf("shard %v: exit %d: %s", args, code, errOut)
	}
	return strings.TrimSpace(out)
}

// TestInspectOrigin: inspect says what a sandbox came from by name. A
// sandbox made from an environment showed "Parent:" and the id of the
// environment's setup sandbox, removed as soon as it was made; one made
// from a snapshot showed nothing.
func TestInspectOrigin(t *testing.T) {
	e := need(t)
	sh := func(args ...string) string { t.Helper(); return cliOK(t, args...) }
	t.Cleanup(func() {
		e.cli(t, "", "remove", "--force", "origin-base", "origin-fork", "origin-snap", "origin-env")
		e.cli(t, "", "snapshot", "rm", "origin-base-v1")
		e.cli(t, "", "env", "rm", "origin-deps")
	})
	inspect := func(name string) []string {
		t.Helper()
		var lines []string
		for _, l := range strings.Split(sh("inspect", name), "\n") {
			lines = append(lines, strings.Join(strings.Fields(l), " "))
		}
		return lines
	}
	origin := func(name, want string) {
		t.Helper()
		lines := inspect(name)
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "Origin: "+want) }) ||
			slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "Parent:") }) {
			t.Fatalf("inspect %s: want a line Origin: %s..., and no Parent:\n%s", name, want, strings.Join(lines, "\n"))
		}
	}
	sh("create", "--name", "origin-base", busybox)
	origin("origin-base", "image "+busybox)
	sh("fork", "--name", "origin-fork", "origin-base")
	origin("origin-fork", "fork of origin-base (checkpoint ")
	sh("stop", "origin-base")
	sh("snapshot", "create", "--name", "origin-base-v1", "origin-base")
	sh("create", "--name", "origin-snap", "--from-snapshot", "origin-base-v1")
	origin("origin-snap", "snapshot origin-base-v1")
	sh("env", "create", "origin-deps", "--memory", "128MiB", busybox, "--", "true")
	sh("create", "--name", "origin-env", "--env-from", "origin-deps")
	origin("origin-env", "environment origin-deps")
	var sb client.Sandbox
	if err := json.Unmarshal([]byte(sh("inspect", "--json", "origin-env")), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.Origin == nil || sb.Origin.Kind != "environment" || sb.Origin.Name != "origin-deps" || sb.Origin.Checkpoint == "" {
		t.Fatalf("inspect --json origin-env: origin %+v", sb.Origin)
	}
	// The names stay once what they name is gone.
	sh("remove", "--force", "origin-base")
	origin("origin-fork", "fork of origin-base (checkpoint ")
}
