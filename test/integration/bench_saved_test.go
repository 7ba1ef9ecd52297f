package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/useshards/shard/internal/agent/host"
	"github.com/useshards/shard/internal/agent/proto"

	"github.com/useshards/shard/client"
)

// BenchmarkEnvCreateFirstExec: from `create --env-from` to the first exec's
// answer in the new sandbox (warm: the environment's setup is in the
// checkpoint), beside the raw flow by hand on the same checkpoint image:
// `runsc restore` into a fresh netns, then the same exec through the
// restored agent; and a cold create of the same image for scale.
func BenchmarkEnvCreateFirstExec(b *testing.B) {
	e := need(b)
	ctx := context.Background()
	env, err := e.c.CreateEnvironment(ctx, client.EnvironmentRequest{Name: "bench-env", Image: busybox, Memory: jsonRaw("128MiB"),
		Setup: [][]string{{"sh", "-c", "echo ok > /root/ok; sleep 100000 >/dev/null 2>&1 &"}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.c.RemoveEnvironment(context.Background(), env.Name) })
	sb0 := create(b, client.CreateRequest{Environment: env.Name})
	bundle, cleanup := rawBundle(b, sb0)
	b.Cleanup(cleanup)
	token := tokenOf(b, sb0.ID)
	img := filepath.Join(e.dataDir, "checkpoints", env.Checkpoint)
	runsc := func(args ...string) []string {
		return append([]string{"--root", filepath.Join(e.runDir, "runsc"), "--platform", "systrap", "--network", "sandbox", "--overlay2", "none"}, args...)
	}
	s := samples{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		sb, err := e.c.Create(ctx, client.CreateRequest{Environment: env.Name})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		s.add("shard-env-first-exec", time.Since(start))
		b.StopTimer()
		e.c.Remove(ctx, sb.ID, true)

		start = time.Now()
		cold, err := e.c.Create(ctx, client.CreateRequest{Image: busybox, Memory: jsonRaw("128MiB")})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := e.c.Exec(ctx, cold.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		s.add("shard-cold-first-exec", time.Since(start))
		e.c.Remove(ctx, cold.ID, true)

		// The raw flow, three ways: a plain `runsc restore` (it creates the
		// sandbox itself); into a sandbox made beforehand with `runsc
		// create` (untimed: what a warm spare would hold); and that plus
		// --background (pages load while the sandbox runs).
		for _, v := range []struct {
			name      string
			precreate bool
			extra     []string
		}{{"raw-restore-first-exec", false, nil}, {"raw-precreated-restore", true, nil}, {"raw-precreated-bg-restore", true, []string{"--background"}}} {
			netCleanup := rawNetns(b)
			rawID := fmt.Sprintf("rawenv%06d", i)
			logf, _ := os.Create(filepath.Join(e.dir, "rawrestore.log"))
			if v.precreate {
				cc := exec.Command("runsc", runsc("create", "--bundle", bundle, rawID)...)
				cc.Stdout, cc.Stderr = logf, logf
				if err := cc.Run(); err != nil {
					out, _ := os.ReadFile(filepath.Join(e.dir, "rawrestore.log"))
					b.Fatalf("raw create: %v %s", err, out)
				}
			}
			b.StartTimer()
			start = time.Now()
			rc := exec.Command("runsc", runsc(append(append([]string{"restore", "--detach", "--image-path", img}, v.extra...), "--bundle", bundle, rawID)...)...)
			rc.Stdout, rc.Stderr = logf, logf
			err = rc.Run()
			if err != nil {
				logf.Close()
				out, _ := os.ReadFile(filepath.Join(e.dir, "rawrestore.log"))
				b.Fatalf("raw restore: %v %s", err, out)
			}
			agentExec(b, token, "10.99.0.2:4951")
			s.add(v.name, time.Since(start))
			b.StopTimer()
			logf.Close()
			exec.Command("runsc", runsc("delete", "--force", rawID)...).Run()
			netCleanup()
		}
		b.StartTimer()
	}
	report(b, s, "raw-restore-first-exec", "raw-restore-first-exec", "raw-precreated-restore", "raw-precreated-bg-restore", "shard-env-first-exec", "shard-cold-first-exec")
}

// agentExec runs `true` through a sandbox's agent directly, as the server
// would, without the server.
func agentExec(b *testing.B, token, addr string) {
	ac := &host.Client{Addr: addr, Token: token}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := ac.Exec(ctx, proto.Request{Argv: []string{"true"}})
	if err != nil {
		b.Fatalf("exec through the agent at %s: %v", addr, err)
	}
	defer sess.Close()
	for {
		typ, _, err := sess.Recv()
		if err != nil || typ == proto.FrameExit {
			return
		}
	}
}

// BenchmarkCheckpoint: a checkpoint of a running sandbox whose process holds
// 16 or 256 MiB: the source's freeze as the process inside sees it, and the
// call's time, beside raw `runsc checkpoint --leave-running` on the same
// source.
func BenchmarkCheckpoint(b *testing.B) {
	for _, mib := range []int{16, 256} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) { benchCheckpoint(b, mib) })
	}
}

func benchCheckpoint(b *testing.B, mib int) {
	e := need(b)
	ctx := context.Background()
	src := holder(b, mib)
	s := samples{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		resetGap(b, src.ID)
		b.StartTimer()
		start := time.Now()
		ck, err := e.c.Checkpoint(ctx, src.ID, client.CheckpointRequest{})
		if err != nil {
			b.Fatal(err)
		}
		s.add("shard-checkpoint", time.Since(start))
		b.StopTimer()
		s.add("shard-freeze", readGap(b, src.ID))
		e.c.RemoveCheckpoint(ctx, ck.ID)

		resetGap(b, src.ID)
		img := filepath.Join(e.dir, "rawimg")
		os.RemoveAll(img)
		os.MkdirAll(img, 0o700)
		b.StartTimer()
		s.add("raw-checkpoint", timeCmd(b, "runsc", "--root", filepath.Join(e.runDir, "runsc"), "--platform", "systrap",
			"--network", "sandbox", "--overlay2", "none", "checkpoint", "--leave-running", "--image-path", img, src.ID))
		b.StopTimer()
		s.add("raw-freeze", readGap(b, src.ID))
		os.RemoveAll(img)
		b.StartTimer()
	}
	report(b, s, "raw-freeze", "raw-freeze", "shard-freeze", "raw-checkpoint", "shard-checkpoint")
}

// BenchmarkExecLedger: what the server and its two ledger events (written
// to disk before the answer) add to an exec of `true`: the API's round trip
// beside the same exec straight through the sandbox's agent. p50, p90 and
// p99.
func BenchmarkExecLedger(b *testing.B) {
	e := need(b)
	ctx := context.Background()
	sb := create(b, client.CreateRequest{Image: busybox})
	token := tokenOf(b, sb.ID)
	s := samples{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		s.add("api-exec", time.Since(start))
		start = time.Now()
		agentExec(b, token, sb.IP+":4951")
		s.add("agent-exec", time.Since(start))
	}
	report(b, s, "agent-exec", "agent-exec", "api-exec")
	for _, k := range []string{"agent-exec", "api-exec"} {
		p99 := pct(s[k], 0.99)
		b.ReportMetric(p99, k+"-p99-ms")
		fmt.Fprintf(os.Stderr, "BENCH %s %-28s p99 %8.2f ms\n", b.Name(), k, p99)
	}
}
