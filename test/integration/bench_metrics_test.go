package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// BenchmarkMetricsScrape: a whole GET /metrics (on --metrics-listen) with
// SHARD_BENCH_SANDBOXES sandboxes (default 100; runc busybox, the cheapest
// to hold) on the server, against GET /v0/version on the same server in the
// same run (the floor of any request). Goal: a scrape under 20 ms.
func BenchmarkMetricsScrape(b *testing.B) {
	e := need(b)
	n := 100
	if v, err := strconv.Atoi(os.Getenv("SHARD_BENCH_SANDBOXES")); err == nil && v > 0 {
		n = v
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	sem := make(chan struct{}, 4)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			sb, err := e.c.Create(ctxT(b), client.CreateRequest{Image: busybox, Provider: "runc", Name: fmt.Sprintf("scrape-%d", i), Memory: json.RawMessage(`"32MiB"`), Disk: json.RawMessage(`"32MiB"`)})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			b.Cleanup(func() { e.c.Remove(ctxT(b), sb.ID, true) })
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		b.Fatalf("%d creates failed; first: %v", len(errs), errs[0])
	}
	get := func(url string) time.Duration {
		start := time.Now()
		resp, err := http.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("GET %s: %d", url, resp.StatusCode)
		}
		return time.Since(start)
	}
	if got := scrapeMetrics(b, e.metrics, ""); got[`shard_sandboxes{provider="runc",state="running"}`] < float64(n) {
		b.Fatalf("the scrape counts %v running runc sandboxes, want %d", got[`shard_sandboxes{provider="runc",state="running"}`], n)
	}
	s := samples{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.add("scrape", get("http://"+e.metrics+"/metrics"))
		s.add("version", get("http://"+e.tcp+"/v0/version"))
	}
	report(b, s, "version", "version", "scrape")
}
