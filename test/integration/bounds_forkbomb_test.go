package integration

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// The bomb: every shell starts two more in the background and exits. Its
// complaints go to /tmp/bomb.err (the exec that starts it returns at once).
// Under bash (python's image) a fork that fails is retried for a while, so
// the bomb holds the bound for as long as it runs; busybox's shell gives up
// at the first failure and the bomb dies out by itself.
const forkBomb = `f(){ f|f& }; f 2>>/tmp/bomb.err`

// startBomb starts the fork bomb in the background of sandbox id, under
// bash.
func startBomb(t *testing.T, id string) {
	t.Helper()
	execOK(t, id, "sh", "-c", "bash -c '"+forkBomb+"' >/dev/null 2>&1 &")
}

// killAll ends every process but the agent (kill -9 -1: the shell's builtin,
// no fork needed), until no more than the command itself is left.
func killAll(t *testing.T, id string) {
	t.Helper()
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := need(t).c.Exec(ctx, id, client.ExecRequest{Argv: []string{"sh", "-c", "kill -9 -1; sleep 1; " + countProcs}})
		cancel()
		if err == nil && res.ExitCode == 0 {
			if n, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout))); n <= 4 {
				return
			}
		}
		if i == 20 {
			t.Fatalf("the fork bomb would not die: %v %+v", err, res)
		}
	}
}

// countProcs counts the sandbox's processes with a glob (no fork: it works
// when forks fail).
const countProcs = `set -- /proc/[0-9]*; echo $#`

// TestForkBombPids: a fork bomb under --pids fails to fork past the bound
// (EAGAIN, "Resource temporarily unavailable") instead of taking the
// sandbox down; the agent still answers and starts commands (on gVisor in
// a small reserve past the bound, so the bomb can be killed from an exec);
// once it is killed, commands and forks work again. Under gVisor the host
// pids cgroup counts the Sentry's threads too, so the bound used to be
// only a backstop there (2n+512 host pids): the bomb reached it and the
// whole sandbox died.
func TestForkBombPids(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			const pids = 256
			sb := create(t, client.CreateRequest{Image: python, Provider: prov, Pids: pids, Memory: jsonRaw("512MiB")})
			startBomb(t, sb.ID)
			// Until it has hit the bound a good while.
			deadline := time.Now().Add(time.Minute)
			for {
				res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", "grep -c 'fork' /tmp/bomb.err"}})
				if err == nil && res.ExitCode == 0 {
					if n, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout))); n > 100 {
						break
					}
				}
				if time.Now().After(deadline) {
					got, _ := e.c.Get(ctxT(t), sb.ID)
					t.Fatalf("the fork bomb never ran into the bound (last exec: %v %+v; sandbox %+v)", err, res, got)
				}
				time.Sleep(500 * time.Millisecond)
			}
			// Shell builtins only: a fork may fail here too (when this
			// command got a slot under the bound, not the reserve).
			res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", `read -r l < /tmp/bomb.err; echo "$l"; ` + countProcs}})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("exec during the fork bomb: %v %+v", err, res)
			}
			out := string(res.Stdout)
			if !strings.Contains(out, "Resource temporarily unavailable") {
				t.Errorf("the bomb's forks past the bound: %q, want EAGAIN (Resource temporarily unavailable)", out)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if n, _ := strconv.Atoi(lines[len(lines)-1]); n > pids+64 {
				t.Errorf("%d processes under --pids %d, want at most the bound plus the agent's reserve", n, pids)
			}
			// End it: kill(-1) reaches every process but the caller and the
			// sandbox's init (the agent), at once.
			killAll(t, sb.ID)
			if got := execOK(t, sb.ID, "sh", "-c", "sleep 0 & wait; echo alive"); got != "alive\n" {
				t.Fatalf("after the fork bomb: %q", got)
			}
			got, err := e.c.Get(ctxT(t), sb.ID)
			if err != nil || got.State != "running" {
				t.Fatalf("after the fork bomb: %+v, %v; want running", got, err)
			}
		})
	}
}

// TestForkBombMemory: a fork bomb under the default --pids (4096) in a
// small --memory. Each process costs the host more than the sandbox's own
// view of its memory shows (under gVisor: the Sentry's structures and the
// host stub of its address space, ~220-330 KiB, of which meminfo shows a
// third), so the bomb used to take the host cgroup past its headroom while
// the OOM guard saw half its bound free, and the host killed the whole
// sandbox. The guard charges processes for that and kills them in batches:
// the sandbox lives, counts OOM kills, and works once the bomb is killed.
//
// gVisor only: under runc a bash bomb in 128MiB still leaves the agent
// unanswering (its memory cgroup thrashes at the bound, every exec times
// out, and the bomb is never killed: seen on both the pids-only and the
// pids/memory/cpu command cgroups). That is an open problem, in the
// closing note, not something this test may hide by passing now and then.
func TestForkBombMemory(t *testing.T) {
	e := need(t)
	for _, prov := range []string{"gvisor"} {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: python, Provider: prov, Memory: jsonRaw("128MiB")})
			startBomb(t, sb.ID)
			// Give it time to grow past what the sandbox may hold (it used
			// to take 10-20 s to take the sandbox down).
			for i := 0; i < 30; i++ {
				time.Sleep(time.Second)
				got, err := e.c.Get(ctxT(t), sb.ID)
				if err != nil || got.State != "running" {
					t.Fatalf("%ds into the fork bomb: %+v, %v; want running", i+1, got, err)
				}
			}
			killAll(t, sb.ID)
			if got := execOK(t, sb.ID, "sh", "-c", "sleep 0 & wait; echo alive"); got != "alive\n" {
				t.Fatalf("after the fork bomb: %q", got)
			}
			got, err := e.c.Get(ctxT(t), sb.ID)
			if err != nil || got.State != "running" {
				t.Fatalf("after the fork bomb: %+v, %v; want running", got, err)
			}
			t.Logf("%s: %d OOM kills", prov, got.OOMKills)
		})
	}
}
