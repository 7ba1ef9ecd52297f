package integration

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/internal/agent/proto"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/provider/gvisor"
)

// TestMemoryBound: a process allocating past --memory dies inside; the
// sandbox and the server live on, and inspect counts the OOM kill.
func TestMemoryBound(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			mem := jsonRaw("64MiB")
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Memory: mem})
			res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"sh", "-c",
				`x=$(head -c 200000000 /dev/zero | tr '\0' a); echo ${#x}`}})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode == 0 {
				t.Fatalf("allocating 200MB under a 64MiB bound succeeded: %q", res.Stdout)
			}
			if got := execOK(t, sb.ID, "echo", "alive"); got != "alive\n" {
				t.Fatalf("sandbox after OOM: %q", got)
			}
			got, err := e.c.Get(ctxT(t), sb.ID)
			if err != nil || got.State != "running" || got.OOMKills < 1 {
				t.Fatalf("inspect after OOM: %+v, %v; want running with oom_kills >= 1", got, err)
			}
			if _, err := e.c.Capabilities(ctxT(t)); err != nil {
				t.Fatalf("server after OOM: %v", err)
			}
		})
	}
}

// TestCPUPidsBounds reads the cgroup the runtime applied, from the host.
func TestCPUPidsBounds(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			cpu := jsonRaw("0.5")
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, CPU: cpu, Pids: 64})
			quota := readTrim(t, "/sys/fs/cgroup/cpu/shard/"+sb.ID+"/cpu.cfs_quota_us")
			period := readTrim(t, "/sys/fs/cgroup/cpu/shard/"+sb.ID+"/cpu.cfs_period_us")
			if quota != "50000" || period != "100000" {
				t.Errorf("cpu quota/period = %s/%s, want 50000/100000", quota, period)
			}
			// runc: commands run in a child cgroup bound to 64; the
			// container's own, where the agent is, has room for it and a
			// reserve past that (internal/provider/runc).
			wantPids := fmt.Sprint(64 + proto.PidsReserve + proto.AgentPids)
			if prov == "gvisor" {
				wantPids = fmt.Sprint(gvisor.PidsBackstop(64))
			} else if got := readTrim(t, "/sys/fs/cgroup/pids/shard/"+sb.ID+"/sandbox/pids.max"); got != "64" {
				t.Errorf("sandbox/pids.max = %s, want 64", got)
			}
			if got := readTrim(t, "/sys/fs/cgroup/pids/shard/"+sb.ID+"/pids.max"); got != wantPids {
				t.Errorf("pids.max = %s, want %s", got, wantPids)
			}
			if prov == "runc" {
				// Past the bound, forks fail inside; the shell counts what
				// runs with a glob (no fork needed); the sandbox lives on.
				res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"sh", "-c",
					`(i=0; while [ $i -lt 200 ]; do sleep 2 & i=$((i+1)); done) 2>/dev/null; set -- /proc/[0-9]*; echo $#`}})
				if err != nil {
					t.Fatal(err)
				}
				n, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
				if n < 32 || n > 64 {
					t.Fatalf("processes under a bound of 64: %q (stderr %q)", res.Stdout, res.Stderr)
				}
				time.Sleep(2500 * time.Millisecond) // let the sleeps end
			}
			if got := execOK(t, sb.ID, "echo", "alive"); got != "alive\n" {
				t.Fatalf("after pids pressure: %q", got)
			}
		})
	}
}

// TestDiskBound: writing past --disk fails with "No space left" inside.
func TestDiskBound(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			disk := jsonRaw("64MiB")
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Disk: disk})
			res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"sh", "-c",
				"dd if=/dev/zero of=/root/big bs=1M count=200 2>&1; sync"}})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode == 0 && !strings.Contains(string(res.Stdout), "space") {
				t.Fatalf("wrote 200MB under a 64MiB disk bound: %q", res.Stdout)
			}
			if !strings.Contains(strings.ToLower(string(res.Stdout)), "no space") {
				t.Fatalf("dd past the bound: %q, want No space left", res.Stdout)
			}
			execOK(t, sb.ID, "rm", "/root/big")
			execOK(t, sb.ID, "sh", "-c", "echo fits > /root/small")
		})
	}
}

func readTrim(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return strings.TrimSpace(string(b))
}

// jsonRaw is s as a JSON string, for the size and cpu fields.
func jsonRaw(s string) []byte { return []byte(fmt.Sprintf("%q", s)) }
