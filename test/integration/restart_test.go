package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// TestKill9Restart: kill -9 the server while sandboxes run, start it again:
// they are still listed, running, and exec works (also into processes and
// files from before).
func TestKill9Restart(t *testing.T) {
	e := need(t)
	var ids []string
	for _, prov := range providers {
		sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "k9-" + prov})
		execOK(t, sb.ID, "sh", "-c", "echo before > /root/f; sleep 1000 >/dev/null 2>&1 &")
		ids = append(ids, sb.ID)
	}
	e.killServer()
	if err := e.startServer(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		sb, err := e.c.Get(ctxT(t), id)
		if err != nil || sb.State != "running" {
			t.Fatalf("after kill -9 and restart: %+v, %v", sb, err)
		}
		if got := execOK(t, id, "cat", "/root/f"); got != "before\n" {
			t.Fatalf("file after restart: %q", got)
		}
		if got := execOK(t, id, "sh", "-c", "pidof sleep >/dev/null && echo yes"); got != "yes\n" {
			t.Fatalf("process from before the restart is gone (%s)", id)
		}
	}
}

// TestBackgroundAndDisconnect: background processes outlive their exec, and
// a command keeps running when its client goes away.
func TestBackgroundAndDisconnect(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov})
			start := time.Now()
			execOK(t, sb.ID, "sh", "-c", "sleep 1000 &")
			if d := time.Since(start); d > 3*time.Second {
				t.Fatalf("exec with a background child took %v: it waited for the child", d)
			}
			if got := execOK(t, sb.ID, "sh", "-c", "pidof sleep >/dev/null && echo yes"); got != "yes\n" {
				t.Fatalf("background process did not survive its exec")
			}
			ctx, cancel := context.WithCancel(context.Background())
			go func() { time.Sleep(300 * time.Millisecond); cancel() }()
			_, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", "sleep 1; echo done > /tmp/after"}})
			if err == nil {
				t.Fatalf("exec returned without error though its client left")
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"cat", "/tmp/after"}})
				if err == nil && string(res.Stdout) == "done\n" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the command did not finish after its client disconnected")
				}
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
}

// TestConcurrentExecs: many execs at once in one sandbox.
func TestConcurrentExecs(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox})
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf("sleep 0.2; echo %d", i)}})
			if err != nil {
				errs <- err
				return
			}
			if strings.TrimSpace(string(res.Stdout)) != fmt.Sprint(i) {
				errs <- fmt.Errorf("exec %d got %q", i, res.Stdout)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestExecTimeout: --timeout kills the command; exit code 124 from the CLI.
func TestExecTimeout(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox})
	start := time.Now()
	_, errOut, code := e.cli(t, "", "exec", "--timeout", "1s", sb.ID, "sleep", "30")
	if code != 124 || !strings.Contains(errOut, "timeout") {
		t.Fatalf("timeout: code %d, %q", code, errOut)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("timeout took %v", d)
	}
}

// TestForkAfterUpgrade: a sandbox started by one build of the server forks
// under the next build (a different binary, so a different agent copy): the
// fork must mount the agent its memory came from.
func TestForkAfterUpgrade(t *testing.T) {
	e := need(t)
	src := create(t, client.CreateRequest{Image: busybox, Name: "upgrade-src"})
	execOK(t, src.ID, "sh", "-c", "echo kept > /root/f")
	next := filepath.Join(e.dir, "shard-next")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=next", "-o", next, "./cmd/shard")
	build.Dir = e.root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	old := e.bin
	e.stopServer()
	e.bin = next
	defer func() {
		e.stopServer()
		e.bin = old
		if err := e.startServer(); err != nil {
			t.Fatal(err)
		}
	}()
	if err := e.startServer(); err != nil {
		t.Fatal(err)
	}
	f, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{Name: "upgrade-fork"})
	if err != nil {
		t.Fatalf("fork under the new server: %v", err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), f.ID, true) })
	if got := execOK(t, f.ID, "cat", "/root/f"); got != "kept\n" {
		t.Fatalf("fork after upgrade: %q", got)
	}
}

// TestSandboxDies: a sandbox whose runtime process is killed from outside
// (as the host OOM killer would) is marked failed with the reason, its
// mounts and network go, and start boots it again with its files.
func TestSandboxDies(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov})
			execOK(t, sb.ID, "sh", "-c", "echo kept > /root/f")
			root := filepath.Join(e.runDir, "runsc")
			bin := "runsc"
			if prov == "runc" {
				root, bin = filepath.Join(e.runDir, "runc"), "runc"
			}
			out, err := exec.Command(bin, "--root", root, "state", sb.ID).Output()
			if err != nil {
				t.Fatal(err)
			}
			var st struct{ Pid int }
			if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
				t.Fatalf("state: %s %v", out, err)
			}
			if err := syscall.Kill(st.Pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(20 * time.Second)
			var got *client.Sandbox
			for time.Now().Before(deadline) {
				got, err = e.c.Get(ctxT(t), sb.ID)
				if err == nil && got.State == "failed" {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if got == nil || got.State != "failed" || got.Error == "" {
				t.Fatalf("after the runtime was killed: %+v", got)
			}
			if _, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"true"}}); err == nil {
				t.Fatalf("exec in a failed sandbox succeeded")
			}
			if _, err := e.c.Start(ctxT(t), sb.ID); err != nil {
				t.Fatalf("start after failure: %v", err)
			}
			if got := execOK(t, sb.ID, "cat", "/root/f"); got != "kept\n" {
				t.Fatalf("files after a failure and start: %q", got)
			}
		})
	}
}

// TestForkImageInRAMAcrossRestart: a fork's checkpoint image is staged in
// RAM and reaches the disk after the fork is answered. A kill -9 in between
// leaves it in RAM: the restarted server finishes the copy, and the
// checkpoint restores. An image the host lost with its RAM (a reboot) takes
// its checkpoint record with it; the fork made from it runs on.
func TestForkImageInRAMAcrossRestart(t *testing.T) {
	e := need(t)
	src := create(t, client.CreateRequest{Image: busybox, Name: "ram-src"})
	execOK(t, src.ID, "sh", "-c", "echo before > /root/f")
	var cks []string
	var forks []*client.Sandbox
	for range 2 {
		f, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{})
		if err != nil {
			t.Fatal(err)
		}
		forks = append(forks, f)
		list, err := e.c.Checkpoints(ctxT(t), src.ID)
		if err != nil || len(list) != len(cks)+1 {
			t.Fatalf("checkpoints of the source after fork %d: %v, %v", len(cks)+1, list, err)
		}
		for _, ck := range list {
			if !slices.Contains(cks, ck.ID) {
				cks = append(cks, ck.ID)
			}
		}
	}
	e.killServer()

	// The state a kill -9 before the copy leaves: pages.img links to the
	// RAM file. (The copy may have been quick enough already: put it back,
	// in a directory of the test's; the server copies from wherever the
	// link points.)
	ramDir := t.TempDir()
	for _, id := range cks {
		pages := filepath.Join(e.dataDir, "checkpoints", id, "pages.img")
		st, err := os.Lstat(pages)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode()&os.ModeSymlink != 0 {
			continue
		}
		ram := filepath.Join(ramDir, id+".pages")
		if out, err := exec.Command("mv", pages, ram).CombinedOutput(); err != nil {
			t.Fatalf("mv: %v %s", err, out)
		}
		if err := os.Symlink(ram, pages); err != nil {
			t.Fatal(err)
		}
	}
	kept, lost := cks[0], cks[1]
	keptTarget, _ := os.Readlink(filepath.Join(e.dataDir, "checkpoints", kept, "pages.img"))
	lostTarget, _ := os.Readlink(filepath.Join(e.dataDir, "checkpoints", lost, "pages.img"))
	if err := os.Remove(lostTarget); err != nil { // the host's RAM is gone
		t.Fatal(err)
	}

	if err := e.startServer(); err != nil {
		t.Fatal(err)
	}
	// The copy renames pages.img into place, then removes the RAM file:
	// wait for both (looking only for the first raced the second).
	pages := filepath.Join(e.dataDir, "checkpoints", kept, "pages.img")
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := os.Lstat(pages)
		_, rerr := os.Stat(keptTarget)
		if err == nil && st.Mode().IsRegular() && os.IsNotExist(rerr) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("checkpoint %s after the restart: pages.img %v (%v), RAM copy %v: want on disk, and the RAM copy gone", kept, st, err, rerr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	sb, err := e.c.RestoreCheckpoint(ctxT(t), kept, client.RestoreRequest{})
	if err != nil {
		t.Fatalf("restore of the checkpoint copied after the restart: %v", err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), sb.ID, true) })
	if got := execOK(t, sb.ID, "cat", "/root/f"); got != "before\n" {
		t.Errorf("file in the restored sandbox: %q", got)
	}

	for {
		_, err := e.c.GetCheckpoint(ctxT(t), lost)
		var ce *client.Error
		if errors.As(err, &ce) && ce.Status == 404 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("checkpoint %s, whose image was lost, is still there: %v", lost, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, f := range forks {
		if got := execOK(t, f.ID, "cat", "/root/f"); got != "before\n" {
			t.Errorf("fork %s after the restart: %q", f.Name, got)
		}
	}
}
