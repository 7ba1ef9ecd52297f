package integration

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// asNobody runs argv on the host as uid/gid 65534, the unprivileged host
// user of the threat model, and returns its output and error.
func asNobody(argv ...string) (string, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestHostFilesReadOnly: /etc/hostname, /etc/hosts and /etc/resolv.conf are
// host files bound into the sandbox; a sandbox can neither plant a setuid
// binary in them nor write past its disk bound through them.
func TestHostFilesReadOnly(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Disk: json.RawMessage(`"64MiB"`)})
			for _, f := range []string{"/etc/hostname", "/etc/hosts", "/etc/resolv.conf"} {
				res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"sh", "-c",
					"cp /bin/busybox " + f + " 2>&1; chmod 4755 " + f + " 2>&1; dd if=/dev/zero of=" + f + " bs=1M count=100 2>&1; ls -l " + f}})
				if err != nil {
					t.Fatal(err)
				}
				host := filepath.Join(e.dataDir, "run", sb.ID, filepath.Base(f))
				st, err := os.Stat(host)
				if err != nil {
					t.Fatal(err)
				}
				if st.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || st.Size() > 4096 {
					t.Errorf("%s: the host file is now %v, %d bytes (sandbox said %q)", f, st.Mode(), st.Size(), res.Stdout)
				}
			}
		})
	}
}

// TestSandboxTreesPrivate: what a sandbox or an image writes is out of reach
// of an unprivileged host user: a setuid-root file planted in a sandbox's
// rootfs cannot be run, and no path under the data directory can be opened.
func TestSandboxTreesPrivate(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov})
			execOK(t, sb.ID, "sh", "-c", "cp /bin/busybox /suid && chmod 4755 /suid && mkdir -p /root/d && cp /bin/busybox /root/d/suid2 && chmod 4755 /root/d/suid2")
			planted := []string{
				filepath.Join(e.dataDir, "run", sb.ID, "rootfs", "suid"),
				filepath.Join(e.dataDir, "run", sb.ID, "hostname"),
				filepath.Join(e.dataDir, "storage", "mnt", sb.ID, "upper", "suid"),
				filepath.Join(e.dataDir, "storage", "mnt", sb.ID, "upper", "root", "d", "suid2"),
			}
			for _, p := range planted {
				if _, err := os.Stat(p); err != nil {
					t.Fatalf("root does not see %s: %v (the test's paths are stale)", p, err)
				}
				if out, err := asNobody(p, "id"); err == nil {
					t.Errorf("an unprivileged host user ran %s: %s", p, out)
				}
				if out, err := asNobody("stat", p); err == nil {
					t.Errorf("an unprivileged host user reached %s: %s", p, out)
				}
			}
			// The sandbox's own filesystem honours no setuid bit or device
			// node on the host, whatever the directories above allow.
			mnt := filepath.Join(e.dataDir, "storage", "mnt", sb.ID)
			found := false
			for _, m := range mounts() {
				if m.point == mnt {
					found = true
					if !strings.Contains(m.opts, "nosuid") || !strings.Contains(m.opts, "nodev") {
						t.Errorf("%s is mounted %s: want nosuid,nodev", mnt, m.opts)
					}
				}
			}
			if !found {
				t.Errorf("%s is not mounted", mnt)
			}
			// A setuid binary still works inside the sandbox (images need su).
			if prov == "runc" {
				if got := execOK(t, sb.ID, "sh", "-c", "ls -l /suid | cut -c1-10"); got != "-rwsr-xr-x\n" {
					t.Errorf("inside the sandbox /suid is %q", got)
				}
			}
		})
	}
	for _, d := range []string{e.dataDir, filepath.Join(e.dataDir, "images"), filepath.Join(e.dataDir, "run"),
		filepath.Join(e.dataDir, "storage"), filepath.Join(e.dataDir, "checkpoints")} {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s is %v: want no access for group and others", d, st.Mode().Perm())
		}
	}
}

// TestDiskAdmission: a disk the store cannot promise is refused at once
// with 507 insufficient_storage naming the sizes, and leaves nothing (no
// record, no template, no ledger session).
func TestDiskAdmission(t *testing.T) {
	e := need(t)
	before, err := e.c.DiskUsage(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if before.Store.CapacityBytes <= 0 || before.Store.FreeBytes > before.Store.CapacityBytes {
		t.Fatalf("df store: %+v", before.Store)
	}
	start := time.Now()
	_, err = e.c.Create(ctxT(t), client.CreateRequest{Image: busybox, Name: "too-big", Disk: json.RawMessage(`"100TiB"`)})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != 507 || ce.Code != "insufficient_storage" || !strings.Contains(ce.Message, "100TiB") {
		t.Fatalf("create with a 100TiB disk: %v, want 507 insufficient_storage naming 100TiB", err)
	}
	t.Logf("refused in %v: %s", time.Since(start), ce.Message)
	if _, err := e.c.Get(ctxT(t), "too-big"); err == nil {
		t.Error("a refused create left a sandbox")
	}
	noSessions(t, "a refused create", "too-big")
	tmpl, _ := filepath.Glob(filepath.Join(e.dataDir, "storage", "templates", "*"))
	for _, p := range tmpl {
		if strings.HasPrefix(filepath.Base(p), "109951162777600") {
			t.Errorf("a refused create left a template: %s", p)
		}
	}
	// A disk that fits now, growing the store, but not beside a fork's
	// copy within the store's most (--storage-max): the fork is refused
	// before the source freezes, and the source runs on.
	if before.Store.SizeBytes == 0 || before.Store.MaxBytes < before.Store.SizeBytes {
		t.Fatalf("df store: %+v, want the image's size and most", before.Store)
	}
	free := before.Store.FreeBytes + before.Store.MaxBytes - before.Store.SizeBytes
	big := free/2 + 64<<20
	src := create(t, client.CreateRequest{Image: busybox, Provider: "gvisor", Name: "half-store", Disk: json.RawMessage(strconv.FormatInt(big, 10))})
	_, err = e.c.Fork(ctxT(t), src.ID, client.ForkRequest{})
	if !errors.As(err, &ce) || ce.Status != 507 || ce.Code != "insufficient_storage" {
		t.Fatalf("fork of a sandbox whose disk does not fit twice: %v, want 507 insufficient_storage", err)
	}
	execOK(t, src.ID, "true")
	_, err = e.c.ForkMany(ctxT(t), src.ID, client.ForkRequest{Count: 3})
	if !errors.As(err, &ce) || ce.Status != 507 || ce.Code != "insufficient_storage" {
		t.Fatalf("fork --count 3 of a sandbox whose disk does not fit twice: %v, want 507 insufficient_storage", err)
	}
	noSessions(t, "a refused fork", "fork-half-store-")
	// A restore of its checkpoint is refused once its record is written
	// (when its disk is copied): it leaves nothing either.
	ck, err := e.c.Checkpoint(ctxT(t), src.ID, client.CheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.RemoveCheckpoint(context.Background(), ck.ID) })
	_, err = e.c.RestoreCheckpoint(ctxT(t), ck.ID, client.RestoreRequest{Name: "half-back"})
	if !errors.As(err, &ce) || ce.Status != 507 || ce.Code != "insufficient_storage" {
		t.Fatalf("restore of a checkpoint whose disk does not fit beside its source: %v, want 507 insufficient_storage", err)
	}
	noSessions(t, "a refused restore", "half-back")
	if got := listNames(t); slices.ContainsFunc(got, func(n string) bool { return n != "half-store" && strings.HasPrefix(n, "half-") }) {
		t.Errorf("a refused fork or restore left sandboxes: %q", got)
	}
	after, err := e.c.DiskUsage(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	grew := after.Store.SizeBytes > before.Store.SizeBytes
	if mayGrow := big > before.Store.FreeBytes; grew != mayGrow || after.Store.SizeBytes > before.Store.MaxBytes {
		t.Errorf("store image %d after a create of %d (it was %d with %d free, most %d)", after.Store.SizeBytes, big, before.Store.SizeBytes, before.Store.FreeBytes, before.Store.MaxBytes)
	}
	if after.Host.ReserveBytes != 2<<30 || after.Host.TotalBytes <= 0 {
		t.Errorf("df host: %+v, want the default 2GiB reserve", after.Host)
	}
}

// TestReconcileKeepsSlowSandbox: a sandbox starved of CPU answers its agent
// late; a kill -9 and restart of the server must keep it running, with its
// processes, since the runtime says it runs.
func TestReconcileKeepsSlowSandbox(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox, Provider: "gvisor", Name: "slow"})
	execOK(t, sb.ID, "sh", "-c", "for i in $(seq 16); do (while :; do :; done) >/dev/null 2>&1 & done")
	// Then starve it, as --cpu 10m would, on the host cgroup (a create
	// with so little CPU takes a minute to start the loops): its agent then
	// answers in tens of seconds, past any timeout a reconcile could wait.
	quota := "/sys/fs/cgroup/cpu/shard/" + sb.ID + "/cpu.cfs_quota_us"
	if err := os.WriteFile(quota, []byte("1000"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}})
	cancel()
	t.Logf("an exec in the starved sandbox within 5s: %v", err)
	t0 := time.Now()
	e.killServer()
	if err := e.startServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted in %v", time.Since(t0))
	got, err := e.c.Get(ctxT(t), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != "running" {
		t.Fatalf("after a restart the slow sandbox is %s (%s), want running", got.State, got.Error)
	}
	out, err := exec.Command("runsc", "--root", filepath.Join(e.runDir, "runsc"), "state", sb.ID).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"running"`) {
		t.Fatalf("runsc state after the restart: %s %v", out, err)
	}
}

// TestExecEndsWithItsSandbox: an exec whose sandbox is removed, or dies,
// ends at once with an exit that says why, and the ledger records its end.
func TestExecEndsWithItsSandbox(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		for _, how := range []string{"removed", "died"} {
			t.Run(prov+"/"+how, func(t *testing.T) {
				sb := create(t, client.CreateRequest{Image: busybox, Provider: prov})
				type result struct {
					res *client.ExecResult
					err error
				}
				done := make(chan result, 1)
				go func() {
					r, err := e.c.Exec(context.Background(), sb.ID, client.ExecRequest{Argv: []string{"sleep", "1000"}})
					done <- result{r, err}
				}()
				waitFor(t, 10*time.Second, func() bool {
					res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"pidof", "sleep"}})
					return err == nil && res.ExitCode == 0
				})
				switch how {
				case "removed":
					if err := e.c.Remove(ctxT(t), sb.ID, true); err != nil {
						t.Fatal(err)
					}
				case "died":
					killRuntime(t, e, prov, sb.ID)
				}
				var r result
				select {
				case r = <-done:
				case <-time.After(30 * time.Second):
					t.Fatalf("the exec of a %s sandbox still runs 30s later", how)
				}
				if r.err != nil {
					t.Fatalf("exec: %v, want an exit that says why", r.err)
				}
				why := map[string]string{"removed": "was removed", "died": "ended"}[how]
				if r.res.ExitCode != 137 || !strings.Contains(r.res.Error, why) {
					t.Fatalf("exit %d %q, want 137 and why (%s)", r.res.ExitCode, r.res.Error, how)
				}
				waitFor(t, 10*time.Second, func() bool {
					evs, err := e.c.Events(ctxT(t), sb.Session, 0, 1000)
					if err != nil {
						return false
					}
					for _, ev := range evs.Events {
						if ev.Type == "sandbox.exec_finished" && strings.Contains(string(ev.Data), why) {
							return true
						}
					}
					return false
				})
			})
		}
	}
}

// TestExecTimeoutOfAStuckSandbox: a sandbox that cannot end a command at its
// timeout (here paused under the server's feet) does not hold the stream.
func TestExecTimeoutOfAStuckSandbox(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox, Provider: "gvisor"})
	root := filepath.Join(e.runDir, "runsc")
	done := make(chan error, 1)
	var res *client.ExecResult
	go func() {
		var err error
		res, err = e.c.Exec(context.Background(), sb.ID, client.ExecRequest{Argv: []string{"sleep", "1000"}, Timeout: json.RawMessage(`"1s"`)})
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	if out, err := exec.Command("runsc", "--root", root, "pause", sb.ID).CombinedOutput(); err != nil {
		t.Fatalf("runsc pause: %v %s", err, out)
	}
	defer exec.Command("runsc", "--root", root, "resume", sb.ID).Run()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exec: %v", err)
		}
		if !res.TimedOut || res.Error == "" {
			t.Fatalf("exec of a stuck sandbox: %+v, want timed out with a reason", res)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the exec with a 1s timeout in a paused sandbox still runs a minute later")
	}
}

func waitFor(t *testing.T, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not so after %v", d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// killRuntime kills a sandbox's runtime from outside the server, as the
// host's OOM killer or an operator would.
func killRuntime(t *testing.T, e *env, prov, id string) {
	t.Helper()
	if err := syscall.Kill(runtimePID(t, e, prov, id), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// runtimePID is the host pid the runtime names for a sandbox (runc: its
// init; runsc: the Sentry), from `state`.
func runtimePID(t *testing.T, e *env, prov, id string) int {
	t.Helper()
	bin := map[string]string{"gvisor": "runsc", "runc": "runc"}[prov]
	out, err := exec.Command(bin, "--root", filepath.Join(e.runDir, bin), "state", id).Output()
	if err != nil {
		t.Fatalf("%s state: %v", bin, err)
	}
	var st struct{ Pid int }
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("%s state: %s %v", bin, out, err)
	}
	return st.Pid
}

// TestDiskFullStaysWithItsSandbox: a sandbox that fills its disk gets ENOSPC
// itself and keeps working, and a neighbour's synced file survives a stop
// and start.
func TestDiskFullStaysWithItsSandbox(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			disk := json.RawMessage(`"64MiB"`)
			filler := create(t, client.CreateRequest{Image: busybox, Provider: prov, Disk: disk})
			quiet := create(t, client.CreateRequest{Image: busybox, Provider: prov, Disk: disk})
			execOK(t, quiet.ID, "sh", "-c", "head -c 4194304 /dev/urandom > /root/keep && sync && md5sum /root/keep > /root/keep.md5 && sync")
			res, err := e.c.Exec(ctxT(t), filler.ID, client.ExecRequest{Argv: []string{"sh", "-c", "dd if=/dev/zero of=/root/fill bs=1M count=200 && sync"}})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "No space left") {
				t.Fatalf("filling a 64MiB disk with 200MiB: exit %d, %q; want ENOSPC", res.ExitCode, res.Stderr)
			}
			execOK(t, filler.ID, "rm", "/root/fill")
			execOK(t, filler.ID, "sh", "-c", "echo ok > /root/after")
			if _, err := e.c.Stop(ctxT(t), quiet.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.c.Start(ctxT(t), quiet.ID); err != nil {
				t.Fatal(err)
			}
			execOK(t, quiet.ID, "md5sum", "-c", "/root/keep.md5")
		})
	}
}

// TestHostUsersCannotReachSandboxes: only the server (root) may open a
// connection into the sandbox network; another host user reaching a
// sandbox's services or its agent directly would bypass the port proxy and
// its scopes.
func TestHostUsersCannotReachSandboxes(t *testing.T) {
	need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov})
			agent := sb.IP + ":4951"
			probe := "exec 3<>/dev/tcp/" + strings.Replace(agent, ":", "/", 1) + " && echo connected"
			if out, err := exec.Command("timeout", "5", "bash", "-c", probe).CombinedOutput(); err != nil || !strings.Contains(string(out), "connected") {
				t.Fatalf("root (the server's user) cannot reach %s: %v %s", agent, err, out)
			}
			if out, err := asNobody("timeout", "5", "bash", "-c", probe); err == nil || strings.Contains(out, "connected") {
				t.Errorf("uid 65534 reached %s: %s", agent, out)
			}
		})
	}
}

// TestGvisorCPUFloor: a gVisor sandbox with too little CPU to boot its
// kernel is refused at once (it was a 500 after 106 s at 10m).
func TestGvisorCPUFloor(t *testing.T) {
	e := need(t)
	_, err := e.c.Create(ctxT(t), client.CreateRequest{Image: busybox, Provider: "gvisor", CPU: json.RawMessage(`"10m"`)})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != 400 || !strings.Contains(ce.Message, "gvisor") {
		t.Fatalf("gvisor create at 10m: %v, want 400 naming gvisor's floor", err)
	}
	sb := create(t, client.CreateRequest{Image: busybox, Provider: "runc", CPU: json.RawMessage(`"10m"`)})
	execOK(t, sb.ID, "true")
}

// TestStopWedgedSandbox: a sandbox whose runtime cannot answer (its Sentry
// stopped from outside) is still stopped, and its execs end.
func TestStopWedgedSandbox(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox, Provider: "gvisor"})
	done := make(chan error, 1)
	go func() {
		_, err := e.c.Exec(context.Background(), sb.ID, client.ExecRequest{Argv: []string{"sleep", "1000"}})
		done <- err
	}()
	waitFor(t, 10*time.Second, func() bool {
		res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"pidof", "sleep"}})
		return err == nil && res.ExitCode == 0
	})
	pid := runtimePID(t, e, "gvisor", sb.ID)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	stopped := make(chan error, 1)
	go func() { _, err := e.c.Stop(context.Background(), sb.ID); stopped <- err }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("stop of a wedged sandbox: %v", err)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("the stop of a wedged sandbox still runs 90s later")
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the exec of a wedged sandbox that was stopped still runs")
	}
	got, err := e.c.Get(ctxT(t), sb.ID)
	if err != nil || got.State != "stopped" {
		t.Fatalf("after the stop: %+v %v", got, err)
	}
}

// noSessions fails t if a ledger session's name starts with prefix: what was
// refused leaves no history of a sandbox that never was, as `shard ledger
// ls` and GET /v0/sessions show it.
func noSessions(t *testing.T, what, prefix string) {
	t.Helper()
	sessions, err := need(t).c.Sessions(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sessions {
		if strings.HasPrefix(s.Name, prefix) {
			t.Errorf("%s left ledger session %s (%d events, the last %s)", what, s.Name, s.Events, s.LastEvent)
		}
	}
	out, errOut, code := need(t).cli(t, "", "ledger", "ls")
	if code != 0 {
		t.Fatalf("shard ledger ls: exit %d: %s", code, errOut)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			t.Errorf("%s: shard ledger ls lists %q", what, l)
		}
	}
}

// listNames is the names of the sandboxes there are.
func listNames(t *testing.T) []string {
	t.Helper()
	sbs, err := need(t).c.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, sb := range sbs {
		out = append(out, sb.Name)
	}
	return out
}
