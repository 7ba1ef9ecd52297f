package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
)

// BenchmarkAuth: what a token check costs. An exec of `true` over TCP with
// an API key (checked on every request: a lookup and a hash) beside the
// same over the Unix socket (no check); and GET /v0/capabilities (answered
// from memory) over TCP with a key beside GET /v0/version over TCP, which
// needs no key: the difference is the check.
func BenchmarkAuth(b *testing.B) {
	e := need(b)
	ctx := context.Background()
	sb := create(b, client.CreateRequest{Image: busybox})
	tc, err := e.c.CreateToken(ctx, client.TokenRequest{Name: "bench-auth", Scopes: []string{auth.SandboxWrite, auth.SandboxRead}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.c.RevokeToken(context.Background(), tc.ID) })
	tcpc, err := client.New(client.Options{Remote: "http://" + e.tcp, APIKey: tc.Key})
	if err != nil {
		b.Fatal(err)
	}
	get := func(url, key string) {
		req, _ := http.NewRequest("GET", url, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("GET %s: %v %v", url, resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	s := samples{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		s.add("exec-socket", time.Since(start))
		start = time.Now()
		if _, err := tcpc.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		s.add("exec-tcp-key", time.Since(start))
		start = time.Now()
		get("http://"+e.tcp+"/v0/version", "")
		s.add("get-tcp-nokey", time.Since(start))
		start = time.Now()
		get("http://"+e.tcp+"/v0/capabilities", tc.Key)
		s.add("capabilities-tcp-key", time.Since(start))
	}
	report(b, s, "exec-socket", "exec-socket", "exec-tcp-key")
	report(b, s, "get-tcp-nokey", "get-tcp-nokey", "capabilities-tcp-key")
}

// BenchmarkPortProxy: download throughput of a 64 MiB file from a server
// in a sandbox, through the shard server's port proxy (over TCP with a
// key) beside straight to the sandbox's address from the host.
func BenchmarkPortProxy(b *testing.B) {
	e := need(b)
	ctx := context.Background()
	sb := create(b, client.CreateRequest{Image: busybox, Memory: jsonRaw("512MiB")})
	execOK(b, sb.ID, "sh", "-c", "mkdir -p /www && dd if=/dev/urandom of=/www/blob bs=1M count=64 2>/dev/null && httpd -p 8080 -h /www")
	tc, err := e.c.CreateToken(ctx, client.TokenRequest{Name: "bench-proxy", Scopes: []string{auth.SandboxWrite}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.c.RevokeToken(context.Background(), tc.ID) })
	fetch := func(url, key string) time.Duration {
		req, _ := http.NewRequest("GET", url, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || n != 64<<20 {
			b.Fatalf("GET %s: %d, %d bytes", url, resp.StatusCode, n)
		}
		return time.Since(start)
	}
	direct := "http://" + sb.IP + ":8080/blob"
	proxied := "http://" + e.tcp + "/v0/sandboxes/" + sb.ID + "/ports/8080/blob"
	for range 50 { // httpd up?
		if resp, err := http.Get(direct); err == nil {
			resp.Body.Close()
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	s := samples{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.add("direct", fetch(direct, ""))
		s.add("proxy", fetch(proxied, tc.Key))
	}
	b.StopTimer()
	report(b, s, "direct", "direct", "proxy")
	for _, k := range []string{"direct", "proxy"} {
		mbs := 64 / (pct(s[k], 0.5) / 1000)
		b.ReportMetric(mbs, k+"-MiB/s")
		fmt.Fprintf(os.Stderr, "BENCH %s %-8s p50 throughput %7.1f MiB/s\n", b.Name(), k, mbs)
	}
}
