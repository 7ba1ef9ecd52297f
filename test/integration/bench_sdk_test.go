package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
)

// BenchmarkSDKExec: the exec round trip of `true` over TCP with an API key,
// from each SDK (Go client, TypeScript, Python) beside raw HTTP (one POST,
// the NDJSON read to its end) and the CLI, in the same run and the same
// sandbox. The TypeScript and Python SDKs time b.N execs with their bench
// scripts and print p50/p90.
func BenchmarkSDKExec(b *testing.B) {
	e := need(b)
	ctx := context.Background()
	tc, err := e.c.CreateToken(ctx, client.TokenRequest{Name: "bench-sdk", Scopes: []string{auth.All}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.c.RevokeToken(context.Background(), tc.ID) })
	remote := "http://" + e.tcp
	env := append(os.Environ(), "SHARD_REMOTE="+remote, "SHARD_API_KEY="+tc.Key, "SHARD_BENCH_IMAGE="+busybox)
	// One runc sandbox for every variant: its exec is short and steady
	// (~4 ms), so what each client adds shows; gVisor's exec varies by
	// more than that between runs.
	sb := create(b, client.CreateRequest{Image: busybox, Memory: jsonRaw("256MiB"), Provider: "runc"})
	env = append(env, "SHARD_BENCH_SANDBOX="+sb.ID)
	goc, err := client.New(client.Options{Remote: remote, APIKey: tc.Key})
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"argv":["true"]}`)
	raw := func() {
		req, _ := http.NewRequest("POST", remote+"/v0/sandboxes/"+sb.ID+"/exec", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tc.Key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("raw exec: %v %v", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	raw() // warm the connection
	s := samples{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		raw()
		s.add("raw-http", time.Since(start))
		start = time.Now()
		if _, err := goc.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		s.add("go-sdk", time.Since(start))
		cli := exec.Command(e.bin, "exec", sb.ID, "true")
		cli.Env = env
		start = time.Now()
		if out, err := cli.CombinedOutput(); err != nil {
			b.Fatalf("cli: %v %s", err, out)
		}
		s.add("cli", time.Since(start))
	}
	b.StopTimer()
	report(b, s, "raw-http", "raw-http", "go-sdk", "cli")
	n := strconv.Itoa(max(b.N, 10))
	line := regexp.MustCompile(`BENCH (\S+) p50 ([0-9.]+) p90 ([0-9.]+)`)
	for _, sdk := range []struct {
		name, dir string
		argv      []string
	}{
		{"python", filepath.Join(e.root, "sdk", "python"), []string{"/usr/bin/python3", "bench/exec_bench.py", "-n", n}},
		{"typescript", filepath.Join(e.root, "sdk", "typescript"), []string{"node", "bench/exec.mjs", "-n", n}},
	} {
		if sdk.name == "typescript" {
			if _, err := os.Stat(filepath.Join(sdk.dir, "dist")); err != nil {
				build := exec.Command("sh", "-c", "npm ci --no-audit --no-fund && npm run build")
				build.Dir = sdk.dir
				if out, err := build.CombinedOutput(); err != nil {
					b.Fatalf("build the TypeScript SDK: %v %s", err, out)
				}
			}
		}
		cmd := exec.Command(sdk.argv[0], sdk.argv[1:]...)
		cmd.Dir, cmd.Env = sdk.dir, env
		out, err := cmd.CombinedOutput()
		m := line.FindSubmatch(out)
		if err != nil || m == nil {
			b.Fatalf("%s bench: %v\n%s", sdk.name, err, out)
		}
		p50, _ := strconv.ParseFloat(string(m[2]), 64)
		p90, _ := strconv.ParseFloat(string(m[3]), 64)
		b.ReportMetric(p50, string(m[1])+"-p50-ms")
		b.ReportMetric(p90, string(m[1])+"-p90-ms")
		r := p50 / pct(s["raw-http"], 0.5)
		fmt.Fprintf(os.Stderr, "BENCH %s %-28s p50 %8.2f ms  p90 %8.2f ms  %.2fx raw-http (+%.2f ms)\n", b.Name(), m[1], p50, p90, r, p50-pct(s["raw-http"], 0.5))
	}
}
