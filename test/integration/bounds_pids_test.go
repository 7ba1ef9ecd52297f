package integration

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// pidsFill starts 200 sleeps under a bound of 64 and counts the processes
// that run (with a glob: no fork needed).
func pidsFill(t *testing.T, id string) int {
	t.Helper()
	res, err := need(t).c.Exec(ctxT(t), id, client.ExecRequest{Argv: []string{"sh", "-c",
		`(i=0; while [ $i -lt 200 ]; do sleep 3 & i=$((i+1)); done) 2>/dev/null; set -- /proc/[0-9]*; echo $#`}})
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	time.Sleep(3500 * time.Millisecond) // let the sleeps end
	return n
}

// TestPidsBoundInside: --pids bounds the processes inside the sandbox on
// both providers: past it, forks fail and the sandbox lives on. Under
// gVisor it used to bound nothing inside (the host pids cgroup, a backstop
// of 2n+512, counts the Sentry's threads, not the guest's processes): all
// 200 ran. A fork of a gVisor sandbox keeps the bound (gVisor saves its
// cgroups with the rest of the kernel), and so does its OOM guard.
func TestPidsBoundInside(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Pids: 64, Memory: jsonRaw("128MiB")})
			if n := pidsFill(t, sb.ID); n < 32 || n > 64 {
				t.Fatalf("processes under --pids 64: %d, want 32..64", n)
			}
			if got := execOK(t, sb.ID, "echo", "alive"); got != "alive\n" {
				t.Fatalf("after pids pressure: %q", got)
			}
			if prov != "gvisor" {
				return
			}
			// No command may gain what the agent set the bound up with.
			if out := execOK(t, sb.ID, "sh", "-c", "grep CapBnd /proc/self/status"); !strings.HasSuffix(strings.TrimSpace(out), "a80405fb") {
				t.Errorf("a command's bounding set: %q, want Docker's defaults (00000000a80405fb), no CAP_SYS_ADMIN", out)
			}
			f, err := e.c.Fork(ctxT(t), sb.ID, client.ForkRequest{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.c.Remove(ctxT(t), f.ID, true) })
			if n := pidsFill(t, f.ID); n < 32 || n > 64 {
				t.Errorf("processes under --pids 64 in a fork: %d, want 32..64", n)
			}
			res, err := e.c.Exec(ctxT(t), f.ID, client.ExecRequest{Argv: []string{"sh", "-c",
				`x=$(head -c 300000000 /dev/zero | tr '\0' a); echo ${#x}`}})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode == 0 {
				t.Fatalf("allocating 300MB under a 128MiB bound in a fork succeeded: %q", res.Stdout)
			}
			got, err := e.c.Get(ctxT(t), f.ID)
			if err != nil || got.State != "running" || got.OOMKills < 1 {
				t.Fatalf("fork after OOM: %+v, %v; want running with oom_kills >= 1", got, err)
			}
			if got := execOK(t, sb.ID, "echo", "alive"); got != "alive\n" {
				t.Fatalf("source after its fork's OOM: %q", got)
			}
		})
	}
}

// TestGuardInWarmSpare: a sandbox handed out from an environment's warm
// spare (restored from its checkpoint, held paused, then resumed) has its
// OOM guard and the host's watch on its memory: past --memory, the biggest
// process dies, the sandbox lives and counts the kill. The guard there was
// idle when the environment was checkpointed; only the host's watch (set
// up again for the new sandbox) wakes it.
func TestGuardInWarmSpare(t *testing.T) {
	e := need(t)
	req := client.EnvironmentRequest{Name: "env-guard", Image: python, Memory: jsonRaw("128MiB"), Provider: "gvisor",
		Setup: [][]string{{"true"}}}
	if _, err := e.c.CreateEnvironment(ctxT(t), req); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.RemoveEnvironment(context.Background(), "env-guard") })
	for i := 0; i < 2; i++ { // the first from the spare, the second from the next one
		sb := create(t, client.CreateRequest{Environment: "env-guard"})
		time.Sleep(2 * time.Second) // the guard's boot watch (if any) is over
		res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"python3", "-c", `x = b"a" * (300 << 20); print(len(x))`}})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 || !res.OOM {
			t.Fatalf("sandbox %d from the environment: 300 MB under a 128MiB bound: exit %d oom %v %q", i, res.ExitCode, res.OOM, res.Stdout)
		}
		got, err := e.c.Get(ctxT(t), sb.ID)
		if err != nil || got.State != "running" || got.OOMKills < 1 {
			t.Fatalf("sandbox %d from the environment after OOM: %+v, %v; want running with oom_kills >= 1", i, got, err)
		}
		if out := execOK(t, sb.ID, "sh", "-c", "grep ' /tmp ' /proc/mounts || echo none"); out != "none\n" {
			t.Errorf("sandbox %d from the environment: /tmp is a mount of its own: %q", i, out)
		}
	}
}
