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
			buildTypeScriptSDK(b, sdk.dir)
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

// BenchmarkSDKStream: exec stream throughput on gVisor (streamBytes, 100 MiB,
// as BenchmarkExecThroughput moves for the Go client). 100 MiB of stdout
// (`head -c 104857600 /dev/zero`) and 100 MiB of stdin (into `wc -c`)
// through the TypeScript and Python SDKs (their bench/stream scripts, over
// TCP with an API key: the binary exec stream, stdin in a framed body) and
// the CLI, beside raw `runsc exec` on the very same sandbox, piped the same
// way, in the same run. Reports seconds and MB/s (10^6 bytes) per variant
// (the median over b.N runs) and each one's time as a multiple of raw
// runsc's.
func BenchmarkSDKStream(b *testing.B) {
	e := need(b)
	ctx := context.Background()
	tc, err := e.c.CreateToken(ctx, client.TokenRequest{Name: "bench-sdk-stream", Scopes: []string{auth.All}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.c.RevokeToken(context.Background(), tc.ID) })
	sb := create(b, client.CreateRequest{Image: busybox, Memory: jsonRaw("512MiB"), Provider: "gvisor"})
	env := append(os.Environ(), "SHARD_REMOTE=http://"+e.tcp, "SHARD_API_KEY="+tc.Key, "SHARD_BENCH_SANDBOX="+sb.ID)
	n := strconv.Itoa(streamBytes)
	runsc := fmt.Sprintf("runsc --root %s --platform systrap --network sandbox --overlay2 none exec %s",
		filepath.Join(e.runDir, "runsc"), sb.ID)
	cli := fmt.Sprintf("%s --socket %s exec %s", e.bin, e.socket, sb.ID)
	// Each shell pipeline prints wc's count, which must be the bytes sent.
	pipelines := []struct{ variant, dir, script string }{
		{"raw-runsc-exec", "stdout", runsc + " head -c " + n + " /dev/zero | wc -c"},
		{"raw-runsc-exec", "stdin", "head -c " + n + " /dev/zero | " + runsc + " wc -c"},
		{"cli", "stdout", cli + " head -c " + n + " /dev/zero | wc -c"},
		{"cli", "stdin", "head -c " + n + " /dev/zero | " + cli + " wc -c"},
	}
	tsDir := filepath.Join(e.root, "sdk", "typescript")
	buildTypeScriptSDK(b, tsDir)
	scripts := []struct {
		name, dir string
		argv      []string
	}{
		{"python", filepath.Join(e.root, "sdk", "python"), []string{"/usr/bin/python3", "bench/stream_bench.py"}},
		{"typescript", tsDir, []string{"node", "bench/stream.mjs"}},
	}
	line := regexp.MustCompile(`BENCH (\S+)-(stdout|stdin)-\d+MiB seconds ([0-9.]+) MBps`)
	s := samples{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, p := range pipelines {
			start := time.Now()
			out, err := exec.Command("sh", "-c", p.script).CombinedOutput()
			d := time.Since(start)
			if got := bytes.TrimSpace(out); err != nil || string(got) != n {
				if p.variant == "cli" { // measured where it works; never fails the benchmark
					fmt.Fprintf(os.Stderr, "BENCH %s %s %s: %v %q\n", b.Name(), p.variant, p.dir, err, got)
					continue
				}
				b.Fatalf("%s: %v %q", p.script, err, got)
			}
			s.add(p.variant+"-"+p.dir, d)
		}
		for _, sc := range scripts {
			cmd := exec.Command(sc.argv[0], sc.argv[1:]...)
			cmd.Dir, cmd.Env = sc.dir, env
			out, err := cmd.CombinedOutput()
			ms := line.FindAllSubmatch(out, -1)
			if err != nil || len(ms) != 2 {
				b.Fatalf("%s stream bench: %v\n%s", sc.name, err, out)
			}
			for _, m := range ms {
				secs, _ := strconv.ParseFloat(string(m[3]), 64)
				s.add(string(m[1])+"-"+string(m[2]), time.Duration(secs*float64(time.Second)))
			}
		}
	}
	b.StopTimer()
	for _, dir := range []string{"stdout", "stdin"} {
		base := pct(s["raw-runsc-exec-"+dir], 0.5) / 1000
		for _, v := range []string{"raw-runsc-exec", "cli", "py-sdk", "ts-sdk"} {
			k := v + "-" + dir
			if len(s[k]) == 0 {
				continue
			}
			secs := pct(s[k], 0.5) / 1000
			mbps := streamBytes / 1e6 / secs
			b.ReportMetric(secs, k+"-s")
			b.ReportMetric(mbps, k+"-MBps")
			ratio := ""
			if v != "raw-runsc-exec" && base > 0 {
				ratio = fmt.Sprintf("  %.2fx raw-runsc-exec", secs/base)
			}
			fmt.Fprintf(os.Stderr, "BENCH %s %-24s 100MiB %-6s %7.2f s %8.1f MB/s%s\n", b.Name(), v, dir, secs, mbps, ratio)
		}
	}
}

// buildTypeScriptSDK runs npm ci and the build in dir unless dist/ is there.
func buildTypeScriptSDK(b testing.TB, dir string) {
	b.Helper()
	if _, err := os.Stat(filepath.Join(dir, "dist")); err == nil {
		return
	}
	build := exec.Command("sh", "-c", "npm ci --no-audit --no-fund && npm run build")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build the TypeScript SDK: %v %s", err, out)
	}
}
