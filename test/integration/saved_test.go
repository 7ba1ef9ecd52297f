package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
)

// wantCode fails unless err is an API error with code (and, if given, a
// message containing part).
func wantCode(t *testing.T, what string, err error, status int, code, part string) {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != code || (status != 0 && ce.Status != status) || !strings.Contains(ce.Message, part) {
		t.Fatalf("%s: got %v (%+v), want %d %s containing %q", what, err, ce, status, code, part)
	}
}

// TestSnapshotRoundTrip: a snapshot of a stopped sandbox's files; a running
// one refused; two creates from it are independent; it outlives its source
// and its removal does not touch the sandboxes made from it.
func TestSnapshotRoundTrip(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			src := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "snap-src-" + prov, Disk: jsonRaw("256MiB")})
			execOK(t, src.ID, "sh", "-c", "echo base > /root/base")
			_, err := e.c.CreateSnapshot(ctxT(t), client.SnapshotRequest{Sandbox: src.ID})
			wantCode(t, "snapshot of a running sandbox", err, 409, "sandbox_running", "shard fork")
			if _, err := e.c.Stop(ctxT(t), src.ID); err != nil {
				t.Fatal(err)
			}
			sn, err := e.c.CreateSnapshot(ctxT(t), client.SnapshotRequest{Sandbox: src.Name, Name: "snap-" + prov})
			if err != nil {
				t.Fatal(err)
			}
			if sn.SandboxID != src.ID || sn.Image != busybox || sn.DiskBytes != src.DiskBytes || sn.Name != "snap-"+prov {
				t.Fatalf("snapshot %+v of %+v", sn, src)
			}
			_, err = e.c.CreateSnapshot(ctxT(t), client.SnapshotRequest{Sandbox: src.Name, Name: "snap-" + prov})
			wantCode(t, "a second snapshot with the same name", err, 409, "name_taken", sn.Name)
			// The snapshot outlives its source.
			if err := e.c.Remove(ctxT(t), src.ID, false); err != nil {
				t.Fatal(err)
			}
			a := create(t, client.CreateRequest{FromSnapshot: sn.Name, Provider: prov})
			b := create(t, client.CreateRequest{FromSnapshot: sn.ID, Provider: prov, Memory: jsonRaw("128MiB")})
			if a.Image != busybox || a.DiskBytes != sn.DiskBytes || b.MemoryBytes != 128<<20 {
				t.Fatalf("sandboxes from the snapshot: %+v %+v", a, b)
			}
			for _, sb := range []*client.Sandbox{a, b} {
				if got := execOK(t, sb.ID, "cat", "/root/base"); got != "base\n" {
					t.Fatalf("file from the snapshot in %s: %q", sb.Name, got)
				}
			}
			execOK(t, a.ID, "sh", "-c", "echo a > /root/only-a")
			if out := execOK(t, b.ID, "sh", "-c", "ls /root"); strings.Contains(out, "only-a") {
				t.Fatalf("a change in one sandbox from a snapshot reached the other: %q", out)
			}
			_, err = e.c.Create(ctxT(t), client.CreateRequest{FromSnapshot: sn.ID, Disk: jsonRaw("1GiB")})
			wantCode(t, "another disk size", err, 400, "invalid_argument", "disk")
			_, err = e.c.Create(ctxT(t), client.CreateRequest{FromSnapshot: "no-such-snapshot"})
			wantCode(t, "an unknown snapshot", err, 404, "snapshot_not_found", "no-such-snapshot")

			list, err := e.c.Snapshots(ctxT(t))
			if err != nil || !slices.ContainsFunc(list, func(s client.Snapshot) bool { return s.ID == sn.ID && s.Size > 0 }) {
				t.Fatalf("snapshot ls: %+v %v", list, err)
			}
			du, err := e.c.DiskUsage(ctxT(t))
			if err != nil || du.Snapshots.Count < 1 || du.Snapshots.Bytes <= 0 || du.Images.Count < 1 || du.TotalBytes <= 0 {
				t.Fatalf("df: %+v %v", du, err)
			}
			if err := e.c.RemoveSnapshot(ctxT(t), sn.Name); err != nil {
				t.Fatal(err)
			}
			if _, err := e.c.GetSnapshot(ctxT(t), sn.ID); err == nil {
				t.Fatal("the removed snapshot is still there")
			}
			if got := execOK(t, a.ID, "cat", "/root/base"); got != "base\n" {
				t.Fatalf("after the snapshot's removal: %q", got)
			}
			// And files from a snapshot survive a stop and start as any.
			e.c.Stop(ctxT(t), b.ID)
			if _, err := e.c.Start(ctxT(t), b.ID); err != nil {
				t.Fatal(err)
			}
			if got := execOK(t, b.ID, "cat", "/root/base"); got != "base\n" {
				t.Fatalf("after stop and start: %q", got)
			}
		})
	}
}

// TestSnapshotRemovedDuringCreate: a snapshot removed while sandboxes are
// being made from it. Each create either gets the snapshot's files or a 404
// snapshot_not_found, never a 500 for a file gone under it (the soak found
// one: "open .../saved/sn-....img: no such file or directory").
func TestSnapshotRemovedDuringCreate(t *testing.T) {
	e := need(t)
	src := create(t, client.CreateRequest{Image: busybox, Provider: "runc", Disk: jsonRaw("256MiB")})
	execOK(t, src.ID, "sh", "-c", "echo base > /root/base")
	if _, err := e.c.Stop(ctxT(t), src.ID); err != nil {
		t.Fatal(err)
	}
	made, refused := 0, 0
	for round := 0; round < 12; round++ {
		sn, err := e.c.CreateSnapshot(ctxT(t), client.SnapshotRequest{Sandbox: src.ID})
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			sb  *client.Sandbox
			err error
		}
		const creates = 4
		res := make(chan result, creates)
		start := make(chan struct{})
		for range creates {
			go func() {
				<-start
				sb, err := e.c.Create(ctxT(t), client.CreateRequest{FromSnapshot: sn.ID, Provider: "runc"})
				res <- result{sb, err}
			}()
		}
		close(start)
		// The removal lands somewhere between the lookups and the copies.
		time.Sleep(time.Duration(round) * 500 * time.Microsecond)
		if err := e.c.RemoveSnapshot(ctxT(t), sn.ID); err != nil {
			t.Fatalf("round %d: remove the snapshot: %v", round, err)
		}
		for range creates {
			r := <-res
			if r.err != nil {
				wantCode(t, "a create from a snapshot being removed", r.err, 404, "snapshot_not_found", "snapshot")
				refused++
				continue
			}
			made++
			if got := execOK(t, r.sb.ID, "cat", "/root/base"); got != "base\n" {
				t.Fatalf("round %d: a sandbox from the removed snapshot has %q", round, got)
			}
			if err := e.c.Remove(ctxT(t), r.sb.ID, true); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("%d sandboxes made, %d creates refused", made, refused)
}

// events reads a whole session.
func events(t *testing.T, session string) []client.Event {
	t.Helper()
	var out []client.Event
	for after := int64(0); ; {
		p, err := need(t).c.Events(ctxT(t), session, after, 2)
		if err != nil {
			t.Fatalf("events of %s: %v", session, err)
		}
		out = append(out, p.Events...)
		if !p.More {
			return out
		}
		after = p.Next
	}
}

func types(evs []client.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

func data(t *testing.T, e client.Event) map[string]any {
	t.Helper()
	var m map[string]any
	if len(e.Data) > 0 {
		if err := json.Unmarshal(e.Data, &m); err != nil {
			t.Fatalf("event %d data %s: %v", e.Seq, e.Data, err)
		}
	}
	return m
}

// TestLedger: every event type with its fields, env names without values,
// a follower that sees events as they come, sessions that outlive their
// sandbox, a name that comes back gets a session of its own, and after a
// kill -9 of the server every acknowledged event is still there.
func TestLedger(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox, Name: "ledger-a"})
	if sb.Session != "ledger-a" {
		t.Fatalf("session %q, want the sandbox's name", sb.Session)
	}
	// A follower from the start, collecting what it sees.
	var mu sync.Mutex
	var seen []string
	fctx, stopFollow := context.WithCancel(context.Background())
	followed := make(chan error, 1)
	go func() {
		followed <- e.c.FollowEvents(fctx, sb.Session, 0, func(ev client.Event) error {
			mu.Lock()
			seen = append(seen, ev.Type)
			mu.Unlock()
			return nil
		})
	}()
	defer stopFollow()

	in := base64.StdEncoding.EncodeToString([]byte("abc"))
	res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", "cat; echo err >&2; exit 3"}, Workdir: "/tmp",
		Env: json.RawMessage(`{"SECRET_TOKEN":"hunter2-do-not-log"}`), Stdin: &in})
	if err != nil || res.ExitCode != 3 || string(res.Stdout) != "abc" {
		t.Fatalf("exec: %+v %v", res, err)
	}
	_, err = e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"no-such-command"}})
	if err == nil {
		t.Fatal("exec of a missing command succeeded")
	}
	ck, err := e.c.Checkpoint(ctxT(t), sb.ID, client.CheckpointRequest{Tag: "t1"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := e.c.Fork(ctxT(t), sb.ID, client.ForkRequest{Name: "ledger-a-fork", Tag: "t2"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Stop(ctxT(t), sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Start(ctxT(t), sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Remove(ctxT(t), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-followed:
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("follow did not end after sandbox.removed")
	}

	evs := events(t, sb.Session)
	want := []string{"sandbox.created", "sandbox.exec_started", "sandbox.exec_finished", "sandbox.exec_started",
		"sandbox.exec_finished", "sandbox.checkpoint_created", "sandbox.checkpoint_created", "sandbox.forked",
		"sandbox.stopped", "sandbox.started", "sandbox.removed"}
	if got := types(evs); !slices.Equal(got, want) {
		t.Fatalf("events:\n got %v\nwant %v", got, want)
	}
	mu.Lock()
	if !slices.Equal(seen, want) {
		t.Errorf("the follower saw %v, want %v", seen, want)
	}
	mu.Unlock()
	for i, ev := range evs {
		if ev.Session != sb.Session || ev.SandboxID != sb.ID || ev.At.IsZero() || (i > 0 && ev.Seq <= evs[i-1].Seq) {
			t.Errorf("event %d: %+v", i, ev)
		}
		if strings.Contains(string(ev.Data), "hunter2") {
			t.Errorf("an env value is in the ledger: %s", ev.Data)
		}
	}
	if d := data(t, evs[0]); d["image"] != busybox || d["provider"] != "gvisor" || d["memory_bytes"] == nil {
		t.Errorf("created: %v", d)
	}
	st, fin := data(t, evs[1]), data(t, evs[2])
	if !slices.Equal(toStrings(st["argv"]), []string{"sh", "-c", "cat; echo err >&2; exit 3"}) || st["cwd"] != "/tmp" ||
		!slices.Equal(toStrings(st["env_names"]), []string{"SECRET_TOKEN"}) || st["exec"] == "" {
		t.Errorf("exec_started: %v", st)
	}
	if fin["exec"] != st["exec"] || fin["exit_code"] != 3.0 || fin["duration_ms"] == nil ||
		fin["stdin_bytes"] != 3.0 || fin["stdout_bytes"] != 3.0 || fin["stderr_bytes"] != 4.0 {
		t.Errorf("exec_finished: %v", fin)
	}
	if d := data(t, evs[4]); d["exit_code"] != nil || !strings.Contains(d["error"].(string), "no-such-command") {
		t.Errorf("exec_finished of a command that did not start: %v", d)
	}
	if d := data(t, evs[5]); d["checkpoint"] != ck.ID || d["tag"] != "t1" || d["kind"] != "checkpoint" {
		t.Errorf("checkpoint_created: %v (checkpoint %s)", d, ck.ID)
	}
	if d := data(t, evs[6]); d["tag"] != "t2" || d["kind"] != "fork" {
		t.Errorf("the fork's checkpoint_created: %v", d)
	}
	if d := data(t, evs[7]); d["fork"] != f.ID || d["name"] != f.Name || d["tag"] != "t2" {
		t.Errorf("forked: %v", d)
	}
	// The session outlives the sandbox; the fork has its own.
	ss, err := e.c.GetSession(ctxT(t), sb.Session)
	if err != nil || ss.Events != int64(len(want)) || ss.LastEvent != "sandbox.removed" || ss.SandboxName != "" {
		t.Errorf("session after removal: %+v %v", ss, err)
	}
	if fe := types(events(t, f.Session)); len(fe) == 0 || fe[0] != "sandbox.created" || f.Session != "fork-ledger-a-"+f.ID[:6] {
		t.Errorf("fork session %s: %v", f.Session, fe)
	}
	e.c.Remove(ctxT(t), f.ID, true)
	// The name comes back: a session of its own.
	again := create(t, client.CreateRequest{Image: busybox, Name: "ledger-a"})
	if again.Session != "ledger-a-2" {
		t.Errorf("a second sandbox named ledger-a has session %q, want ledger-a-2", again.Session)
	}
	all, err := e.c.Sessions(ctxT(t))
	if err != nil || !slices.ContainsFunc(all, func(s client.Session) bool { return s.Name == "ledger-a" }) ||
		!slices.ContainsFunc(all, func(s client.Session) bool { return s.Name == "ledger-a-2" && s.SandboxName == "ledger-a" }) {
		t.Errorf("ledger ls: %+v %v", all, err)
	}
	_, err = e.c.Events(ctxT(t), "no-such-session", 0, 10)
	wantCode(t, "events of an unknown session", err, 404, "session_not_found", "no-such-session")

	// kill -9: what was acknowledged stays.
	for i := range 20 {
		execOK(t, again.ID, "sh", "-c", "echo "+strings.Repeat("x", i))
	}
	before := events(t, again.Session)
	e.killServer()
	if err := e.startServer(); err != nil {
		t.Fatal(err)
	}
	after := events(t, again.Session)
	if len(after) < len(before) || !slices.Equal(types(after[:len(before)]), types(before)) {
		t.Fatalf("after kill -9: %d events, before %d", len(after), len(before))
	}
	if n := len(before); n != 1+2*20 {
		t.Fatalf("%d events for a create and 20 execs, want 41", n)
	}
}

func toStrings(v any) []string {
	var out []string
	l, _ := v.([]any)
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// TestCheckpointRestoreResume: restore (restoreSnapshot) starts from the
// checkpoint with a clean history; resume replays the execs after it, so
// their effects are visible; the checkpoint of a fork is listed too.
func TestCheckpointRestoreResume(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox, Name: "crr", Memory: jsonRaw("128MiB")})
	execOK(t, sb.ID, "sh", "-c", "echo 1 > /root/one")
	execOK(t, sb.ID, "sh", "-c", counterScript+" >/dev/null 2>&1 &")
	ck, err := e.c.Checkpoint(ctxT(t), sb.ID, client.CheckpointRequest{Tag: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if ck.Kind != "checkpoint" || ck.Tag != "base" || ck.SandboxID != sb.ID || ck.Session != sb.Session || ck.Size <= 0 || ck.MemoryBytes != 128<<20 {
		t.Fatalf("checkpoint %+v", ck)
	}
	// The source runs on.
	n := checkCounting(t, "source", sb.ID)
	time.Sleep(100 * time.Millisecond)
	if checkCounting(t, "source", sb.ID) <= n {
		t.Fatal("the source stopped counting after the checkpoint")
	}
	execOK(t, sb.ID, "sh", "-c", "echo 2 > /root/two")
	res, _ := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", "echo 3 > /root/three; exit 7"}})
	if res == nil || res.ExitCode != 7 {
		t.Fatalf("exec: %+v", res)
	}
	// An exec left running: it is started again on resume, not waited for.
	execOK(t, sb.ID, "sh", "-c", "sleep 1000 >/dev/null 2>&1 &") // ends at once: replayed and waited
	go e.c.Exec(context.Background(), sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", "echo run > /root/running; sleep 1000"}})
	time.Sleep(time.Second)
	f, err := e.c.Fork(ctxT(t), sb.ID, client.ForkRequest{Tag: "forked"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), f.ID, true) })

	cks, err := e.c.Checkpoints(ctxT(t), sb.Name)
	if err != nil || len(cks) != 2 || cks[0].ID != ck.ID || cks[1].Kind != "fork" || cks[1].Tag != "forked" {
		t.Fatalf("checkpoint ls: %+v %v", cks, err)
	}
	// Take the fork's checkpoint away, so resume starts from ck.
	if err := e.c.RemoveCheckpoint(ctxT(t), cks[1].ID); err != nil {
		t.Fatal(err)
	}

	r, err := e.c.RestoreCheckpoint(ctxT(t), ck.ID, client.RestoreRequest{Name: "crr-restored"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), r.ID, true) })
	if got := execOK(t, r.ID, "sh", "-c", "ls /root"); strings.TrimSpace(got) != "one" {
		t.Fatalf("restore: files %q, want only one", got)
	}
	checkCounting(t, "restored", r.ID) // the counter's memory came along
	if types := types(events(t, r.Session)); types[0] != "sandbox.created" || slices.Contains(types[:1], "sandbox.exec_started") || len(types) != 1+2*2 {
		t.Errorf("the restored sandbox's session: %v (a clean history, then this test's 2 execs)", types)
	}

	out, err := e.c.Resume(ctxT(t), sb.Session, client.ResumeRequest{Name: "crr-resumed"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), out.Sandbox.ID, true) })
	// After the checkpoint: two cat /tmp/count (checkCounting), echo 2,
	// exit 7, the background sleep, and the one still running.
	if out.Checkpoint != ck.ID || len(out.Replayed) != 6 {
		t.Fatalf("resume: checkpoint %s, replayed %+v", out.Checkpoint, out.Replayed)
	}
	rep := out.Replayed[2:]
	if rep[0].ExitCode == nil || *rep[0].ExitCode != 0 || rep[1].RecordedExit == nil || *rep[1].RecordedExit != 7 ||
		rep[1].ExitCode == nil || *rep[1].ExitCode != 7 || rep[3].ExitCode != nil || rep[3].RecordedExit != nil || rep[3].Error != "" {
		t.Fatalf("replayed: %+v", rep)
	}
	got := execOK(t, out.Sandbox.ID, "sh", "-c", "sleep 0.5; ls /root; pidof sleep >/dev/null && echo sleeping")
	if strings.Join(strings.Fields(got), " ") != "one running three two sleeping" {
		t.Fatalf("resumed sandbox: %q, want the later execs' files and the running one", got)
	}
	checkCounting(t, "resumed", out.Sandbox.ID)
	if d := data(t, events(t, out.Sandbox.Session)[0]); d["resumed_from"] != sb.Session || d["checkpoint"] != ck.ID {
		t.Errorf("resumed created event: %v", d)
	}
	_, err = e.c.Resume(ctxT(t), "no-such-session", client.ResumeRequest{})
	wantCode(t, "resume of an unknown session", err, 404, "session_not_found", "no-such-session")
	_, err = e.c.RestoreCheckpoint(ctxT(t), "000000000000", client.RestoreRequest{})
	wantCode(t, "restore of an unknown checkpoint", err, 404, "checkpoint_not_found", "000000000000")

	// Checkpoint refused: a stopped sandbox, and runc.
	rc := create(t, client.CreateRequest{Image: busybox, Provider: "runc"})
	_, err = e.c.Checkpoint(ctxT(t), rc.ID, client.CheckpointRequest{})
	wantCode(t, "checkpoint on runc", err, 409, "unsupported", "provider runc does not support checkpoint on this host")
	e.c.Stop(ctxT(t), rc.ID)
	_, err = e.c.Checkpoint(ctxT(t), rc.ID, client.CheckpointRequest{})
	wantCode(t, "checkpoint of a stopped sandbox", err, 409, "sandbox_not_running", "is stopped")

	// A session with no checkpoint is resumed from its start: the image,
	// then every exec.
	plain := create(t, client.CreateRequest{Image: busybox, Name: "crr-plain"})
	execOK(t, plain.ID, "sh", "-c", "echo p > /root/p")
	out2, err := e.c.Resume(ctxT(t), plain.Session, client.ResumeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), out2.Sandbox.ID, true) })
	if out2.Checkpoint != "" || execOK(t, out2.Sandbox.ID, "cat", "/root/p") != "p\n" {
		t.Fatalf("resume without a checkpoint: %+v", out2)
	}
}

// TestEnvironment: the setup runs once; sandboxes from the environment
// start with its files and processes; the same definition again is a no-op,
// a changed one rebuilds; a failing setup is a clear error.
func TestEnvironment(t *testing.T) {
	e := need(t)
	req := client.EnvironmentRequest{Name: "env-base", Image: busybox, Memory: jsonRaw("128MiB"),
		Setup: [][]string{
			{"sh", "-c", "echo ran >> /root/setup-runs"},
			{"sh", "-c", counterScript + " >/dev/null 2>&1 &"},
		}}
	env, built, err := e.c.BuildEnvironment(ctxT(t), req)
	if err != nil || !built {
		t.Fatalf("env create: %+v %v %v", env, built, err)
	}
	t.Cleanup(func() { e.c.RemoveEnvironment(context.Background(), "env-base") })
	if env.MemoryBytes != 128<<20 || env.Checkpoint == "" || env.Fingerprint == "" {
		t.Fatalf("environment %+v", env)
	}
	again, built, err := e.c.BuildEnvironment(ctxT(t), req)
	if err != nil || built || again.Checkpoint != env.Checkpoint {
		t.Fatalf("the same definition again: %+v built=%v %v", again, built, err)
	}
	var sbs []*client.Sandbox
	for _, n := range []string{"from-env-1", "from-env-2"} {
		sb := create(t, client.CreateRequest{Environment: "env-base", Name: n})
		if sb.MemoryBytes != 128<<20 || sb.Image != busybox {
			t.Fatalf("sandbox from the environment: %+v", sb)
		}
		sbs = append(sbs, sb)
	}
	for _, sb := range sbs {
		if got := execOK(t, sb.ID, "cat", "/root/setup-runs"); got != "ran\n" {
			t.Fatalf("%s: setup-runs %q: the setup ran more than once, or not", sb.Name, got)
		}
		// Its own hostname, in the kernel as in /etc/hostname (a warm
		// spare is restored before its name is known).
		if got := execOK(t, sb.ID, "sh", "-c", "hostname; cat /etc/hostname"); got != sb.Name+"\n"+sb.Name+"\n" {
			t.Errorf("%s: hostname and /etc/hostname %q", sb.Name, got)
		}
		n := checkCounting(t, sb.Name, sb.ID)
		time.Sleep(100 * time.Millisecond)
		if checkCounting(t, sb.Name, sb.ID) <= n {
			t.Fatalf("%s: the setup's process is not running", sb.Name)
		}
	}
	_, err = e.c.Create(ctxT(t), client.CreateRequest{Environment: "env-base", Memory: jsonRaw("1GiB")})
	wantCode(t, "bounds with an environment", err, 400, "invalid_argument", "leave out")
	// The environment's checkpoint cannot be removed from under it.
	err = e.c.RemoveCheckpoint(ctxT(t), env.Checkpoint)
	wantCode(t, "rm of an environment's checkpoint", err, 409, "checkpoint_in_use", "env-base")

	// A changed definition rebuilds, and the old checkpoint goes.
	req.Setup = append(req.Setup, []string{"touch", "/root/v2"})
	v2, built, err := e.c.BuildEnvironment(ctxT(t), req)
	if err != nil || !built || v2.Checkpoint == env.Checkpoint || v2.Fingerprint == env.Fingerprint {
		t.Fatalf("changed definition: %+v built=%v %v", v2, built, err)
	}
	if _, err := e.c.GetCheckpoint(ctxT(t), env.Checkpoint); err == nil {
		t.Error("the old environment's checkpoint is still there")
	}
	sb3 := create(t, client.CreateRequest{Environment: "env-base"})
	execOK(t, sb3.ID, "ls", "/root/v2")

	_, err = e.c.CreateEnvironment(ctxT(t), client.EnvironmentRequest{Name: "env-bad", Image: busybox,
		Setup: [][]string{{"sh", "-c", "echo oops >&2; exit 5"}}})
	wantCode(t, "a failing setup", err, 422, "setup_failed", "setup command sh -c 'echo oops >&2; exit 5' exited 5")
	if !strings.Contains(err.Error(), "oops") {
		t.Errorf("the setup error lacks its output: %v", err)
	}
	if _, err := e.c.GetEnvironment(ctxT(t), "env-bad"); err == nil {
		t.Error("a failed environment was kept")
	}
	all, _ := e.c.List(ctxT(t))
	for _, sb := range all {
		if strings.HasPrefix(sb.Name, "env-") {
			t.Errorf("a setup sandbox was left behind: %s (%s)", sb.Name, sb.State)
		}
	}
	envs, err := e.c.Environments(ctxT(t))
	if err != nil || len(envs) != 1 || envs[0].Name != "env-base" {
		t.Errorf("env ls: %+v %v", envs, err)
	}
	du, err := e.c.DiskUsage(ctxT(t))
	if err != nil || du.Environments.Count != 1 || du.Environments.Bytes <= 0 {
		t.Errorf("df: %+v %v", du, err)
	}
	if err := e.c.RemoveEnvironment(ctxT(t), "env-base"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.GetCheckpoint(ctxT(t), v2.Checkpoint); err == nil {
		t.Error("env rm left its checkpoint")
	}
	// Sandboxes from a removed environment run on.
	checkCounting(t, "after env rm", sbs[0].ID)
}

// TestEnvironmentRebuildUnderLoad: creates from an environment go on while
// it is rebuilt, and none fails. The rebuild drops the old checkpoint, which
// a create that looked it up a moment before is still restoring from: the
// drop waits for it, and a create that finds the checkpoint gone takes the
// environment's new one.
func TestEnvironmentRebuildUnderLoad(t *testing.T) {
	e := need(t)
	req := client.EnvironmentRequest{Name: "env-load", Image: busybox, Memory: jsonRaw("64MiB"),
		Setup: [][]string{{"sh", "-c", "echo v1 > /root/version"}}}
	if _, _, err := e.c.BuildEnvironment(ctxT(t), req); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.RemoveEnvironment(context.Background(), "env-load") })

	rebuilt := make(chan struct{})
	var (
		mu       sync.Mutex
		versions = map[string]int{}
		failures []string
	)
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			after := 0 // creates once the rebuild is done: a few, then stop
			for i := 0; i < 40 && after < 2; i++ {
				select {
				case <-rebuilt:
					after++
				default:
				}
				sb, err := e.c.Create(ctxT(t), client.CreateRequest{Environment: "env-load", Name: fmt.Sprintf("load-%d-%d", w, i)})
				if err != nil {
					mu.Lock()
					failures = append(failures, err.Error())
					mu.Unlock()
					continue
				}
				res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"cat", "/root/version"}})
				mu.Lock()
				if err != nil || res.ExitCode != 0 {
					failures = append(failures, fmt.Sprintf("exec in %s: %v %+v", sb.Name, err, res))
				} else {
					versions[strings.TrimSpace(string(res.Stdout))]++
				}
				mu.Unlock()
				if err := e.c.Remove(ctxT(t), sb.ID, true); err != nil {
					t.Errorf("rm %s: %v", sb.Name, err)
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // creates under way
	req.Setup = [][]string{{"sh", "-c", "echo v2 > /root/version"}}
	_, built, err := e.c.BuildEnvironment(ctxT(t), req)
	close(rebuilt)
	wg.Wait()
	if err != nil || !built {
		t.Fatalf("rebuild: built=%v %v", built, err)
	}
	if len(failures) > 0 {
		t.Errorf("%d creates failed during the rebuild:\n%s", len(failures), strings.Join(failures, "\n"))
	}
	if versions["v2"] == 0 {
		t.Errorf("no create after the rebuild saw its files: %v", versions)
	}
	t.Logf("creates by version: %v", versions)
}

// TestResumeReappliesGrantsAndPolicy: grants and policy changes recorded
// after the checkpoint are made again by resume, each in its place among
// the execs, so a replayed exec sees the grant it had; a grant whose secret
// is gone is reported, and the rest goes on.
func TestResumeReappliesGrantsAndPolicy(t *testing.T) {
	e := need(t)
	for _, s := range []string{"rr-one", "rr-gone"} {
		if _, err := e.c.SetSecret(ctxT(t), s, []byte("value-of-"+s)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.c.RemoveSecret(context.Background(), s) })
	}
	sb := create(t, client.CreateRequest{Image: busybox, Name: "rr-src"})
	if _, err := e.c.Checkpoint(ctxT(t), sb.ID, client.CheckpointRequest{Tag: "base"}); err != nil {
		t.Fatal(err)
	}
	// After the checkpoint: grant, an exec that uses it, a policy, an
	// ungrant, an exec that no longer has it; and a grant of a secret that
	// is removed before the resume.
	if _, err := e.c.Grant(ctxT(t), sb.ID, client.Grant{Secret: "rr-one", Env: "ONE"}); err != nil {
		t.Fatal(err)
	}
	execOK(t, sb.ID, "sh", "-c", `echo "[$ONE]" > /root/with`)
	if _, err := e.c.SetPolicy(ctxT(t), sb.ID, client.Policy{Deny: []string{"192.0.2.0/24"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Ungrant(ctxT(t), sb.ID, "rr-one"); err != nil {
		t.Fatal(err)
	}
	execOK(t, sb.ID, "sh", "-c", `echo "[$ONE]" > /root/without`)
	if _, err := e.c.Grant(ctxT(t), sb.ID, client.Grant{Secret: "rr-gone", Env: "GONE"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Ungrant(ctxT(t), sb.ID, "rr-gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Grant(ctxT(t), sb.ID, client.Grant{Secret: "rr-gone", Env: "GONE"}); err != nil {
		t.Fatal(err)
	}
	e.c.Ungrant(ctxT(t), sb.ID, "rr-gone") // so the secret can go
	if err := e.c.RemoveSecret(ctxT(t), "rr-gone"); err != nil {
		t.Fatal(err)
	}

	// The session's grants and policy are carried: a key needs their scopes.
	write := token(t, "rr-write", auth.SandboxWrite, auth.SandboxRead) // a resume shows history: sandbox:read too
	if status, ce := tcpCall(t, "POST", "/v0/ledger/sessions/rr-src/resume", write, []byte("{}")); status != 403 || !strings.Contains(ce.Message, "secret:*") {
		t.Fatalf("resume of a session with grants, without secret:*: %d %+v", status, ce)
	}
	out, err := e.c.Resume(ctxT(t), sb.Session, client.ResumeRequest{Name: "rr-resumed"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), out.Sandbox.ID, true) })
	var got []string
	for _, r := range out.Reapplied {
		s := strings.TrimPrefix(r.Event, "sandbox.") + " " + r.Secret
		if r.Error != "" {
			s += " (failed)"
		}
		got = append(got, strings.TrimSpace(s))
	}
	want := []string{"secret_granted rr-one", "policy_set", "secret_ungranted rr-one",
		"secret_granted rr-gone (failed)", "secret_ungranted rr-gone (failed)",
		"secret_granted rr-gone (failed)", "secret_ungranted rr-gone (failed)"}
	if !slices.Equal(got, want) {
		t.Fatalf("reapplied %q, want %q (%+v)", got, want, out.Reapplied)
	}
	if !strings.Contains(out.Reapplied[3].Error, "rr-gone") {
		t.Errorf("the failed grant's error does not name the secret: %q", out.Reapplied[3].Error)
	}
	if got := execOK(t, out.Sandbox.ID, "cat", "/root/with", "/root/without"); got != "[value-of-rr-one]\n[]\n" {
		t.Fatalf("replayed execs wrote %q: each should have had the grants of its moment", got)
	}
	if len(out.Sandbox.Grants) != 0 || out.Sandbox.Policy == nil || !slices.Equal(out.Sandbox.Policy.Deny, []string{"192.0.2.0/24"}) {
		t.Fatalf("resumed sandbox: grants %+v policy %+v, want none and the source's policy", out.Sandbox.Grants, out.Sandbox.Policy)
	}
}
