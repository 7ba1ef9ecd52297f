package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// BenchmarkIdleCPU: what one idle gVisor sandbox costs the host in CPU, as
// a percentage of one core: its cpuacct cgroup (the Sentry, the gofer and
// everything in the guest) over a window of SHARD_BENCH_IDLE_SECONDS
// (default 30) seconds, after it settled. Three states:
//
//   - idle: nothing running but the agent;
//   - tmp-150MiB: a 150 MiB file written to /tmp, then nothing;
//   - mem-150MiB: a process holding 150 MiB of memory, asleep.
//
// All three have --memory 256MiB, so 150 MiB is past half the bound. It
// also reports the CPU shard serve itself used in the same window (its
// share of watching the sandbox). Run it with:
//
//	SHARD_INTEGRATION=1 go test ./test/integration -run '^$' -bench IdleCPU -benchtime 1x
//
// A measurement, not an assertion: nothing here fails on a number.
func BenchmarkIdleCPU(b *testing.B) {
	secs := 30
	if v, err := strconv.Atoi(os.Getenv("SHARD_BENCH_IDLE_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	window := time.Duration(secs) * time.Second
	states := []struct {
		name  string
		image string
		setup []string // run in the sandbox before it settles
	}{
		{"idle", busybox, nil},
		{"tmp-150MiB", busybox, []string{"sh", "-c", "dd if=/dev/zero of=/tmp/blob bs=1M count=150 2>/dev/null"}},
		{"mem-150MiB", python, []string{"sh", "-c", `nohup python3 -c '
import time
x = b"\x01" * (150 << 20)
open("/tmp/held", "w").close()
time.sleep(10**6)' >/dev/null 2>&1 &`}},
	}
	for _, st := range states {
		b.Run(st.name, func(b *testing.B) {
			e := need(b)
			sb := create(b, client.CreateRequest{Image: st.image, Provider: "gvisor", Memory: jsonRaw("256MiB")})
			if st.setup != nil {
				execOK(b, sb.ID, st.setup...)
			}
			if st.name == "mem-150MiB" {
				waitFile(b, sb.ID, "/tmp/held")
			}
			time.Sleep(5 * time.Second) // let it settle
			cg := "/sys/fs/cgroup/cpuacct/shard/" + sb.ID + "/cpuacct.usage"
			serve := e.server.Process.Pid
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c0, s0, t0 := readInt(b, cg), procCPU(serve), time.Now()
				time.Sleep(window)
				c1, s1, el := readInt(b, cg), procCPU(serve), time.Since(t0)
				sandboxPct := float64(c1-c0) / float64(el.Nanoseconds()) * 100
				servePct := (s1 - s0).Seconds() / el.Seconds() * 100
				b.ReportMetric(sandboxPct, "sandbox-cpu-%")
				b.ReportMetric(servePct, "serve-cpu-%")
				fmt.Fprintf(os.Stderr, "BENCH %s sandbox %.2f%% of a core, shard serve %.2f%%, over %s\n",
					b.Name(), sandboxPct, servePct, el.Round(time.Second))
			}
		})
	}
}

// waitFile waits until path exists in the sandbox.
func waitFile(tb testing.TB, id, path string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for ctx.Err() == nil {
		res, err := need(tb).c.Exec(ctx, id, client.ExecRequest{Argv: []string{"test", "-e", path}})
		if err == nil && res.ExitCode == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	tb.Fatalf("%s never appeared in %s", path, id)
}

func readInt(tb testing.TB, path string) int64 {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	return n
}

// procCPU is a host process's user plus system CPU time so far.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+2:]
	}
	f := strings.Fields(s)
	if len(f) < 13 {
		return 0
	}
	// Fields after the name: state is [0], utime [11], stime [12], in
	// clock ticks (100 a second on Linux).
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * 10 * time.Millisecond
}
