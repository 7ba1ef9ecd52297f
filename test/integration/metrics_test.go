package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
)

// scrapeMetrics reads GET /metrics from addr (with key, if any) and returns
// each series' value by its name and labels as the text format spells them.
func scrapeMetrics(t testing.TB, addr, key string) map[string]float64 {
	t.Helper()
	return parseMetrics(t, scrapeText(t, addr, key))
}

// scrapeText reads GET /metrics from addr (with key, if any).
func scrapeText(t testing.TB, addr, key string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("scrape %s: %d %v %s", addr, resp.StatusCode, err, b)
	}
	return string(b)
}

// parseMetrics returns each series' value of a scrape by its name and
// labels as the text format spells them.
func parseMetrics(t testing.TB, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("scrape: %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// TestMetricsProvidersHere: a scrape passes Prometheus' linter (promlint,
// what `promtool check metrics` runs), names only the providers that run on
// this host (no always-zero series for the others), and has each one's OOM
// counter before any OOM kill, so rate() works from the start. The Unix
// socket answers GET /metrics too, as docs/console-and-metrics.md shows
// with curl.
func TestMetricsProvidersHere(t *testing.T) {
	e := need(t)
	caps, err := e.c.Capabilities(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	here := map[string]bool{}
	for _, c := range caps {
		here[c.Name] = c.Available
	}
	text := scrapeText(t, e.metrics, "")
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	got := parseMetrics(t, text)
	series := regexp.MustCompile(`^(shard_[a-z_]+)\{.*provider="([^"]*)"`)
	for s := range got {
		if m := series.FindStringSubmatch(s); m != nil && !here[m[2]] {
			t.Errorf("%s: %s cannot run on this host, yet it has a series", s, m[2])
		}
	}
	for p, ok := range here {
		if !ok {
			continue
		}
		if _, ok := got[fmt.Sprintf(`shard_oom_kills_total{provider=%q}`, p)]; !ok {
			t.Errorf("no shard_oom_kills_total{provider=%q}: a provider that runs here counts from 0", p)
		}
		if _, ok := got[fmt.Sprintf(`shard_sandboxes{provider=%q,state="running"}`, p)]; !ok {
			t.Errorf("no shard_sandboxes{provider=%q,state=\"running\"}", p)
		}
	}

	out, err := exec.Command("curl", "-sSf", "--unix-socket", e.socket, "http://localhost/metrics").CombinedOutput()
	if err != nil {
		t.Fatalf("curl --unix-socket %s http://localhost/metrics: %v\n%s", e.socket, err, out)
	}
	if _, ok := parseMetrics(t, string(out))["shard_state_scrape_errors"]; !ok {
		t.Errorf("GET /metrics on the Unix socket has no shard_state_scrape_errors:\n%.2000s", out)
	}
}

// TestMetricsAndRequestIDs: /metrics on the TCP listener needs metrics:read
// and is open on --metrics-listen; a fork is counted in the fork histogram
// and each of its phases, an exec by its exit class, sandboxes by state;
// an error answer's X-Request-Id finds its line in the access log; whoami
// tells a key what it is.
func TestMetricsAndRequestIDs(t *testing.T) {
	e := need(t)
	// The metrics are every project's: a key of every project reads
	// them, a project's key does not, whatever its scopes.
	tc, err := e.c.CreateToken(ctxT(t), client.TokenRequest{Name: "metrics-reader", Scopes: []string{auth.MetricsRead}, Project: "*"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.RevokeToken(context.Background(), tc.ID) })
	mkey := tc.Key
	pkey := token(t, "metrics-project", auth.All)
	rkey := token(t, "metrics-sbread", auth.SandboxRead)

	if got := scrapeMetrics(t, e.tcp, mkey); len(got) == 0 {
		t.Fatal("a scrape with metrics:read found no series")
	}
	if status, ce := tcpCall(t, "GET", "/metrics", pkey, nil); status != 403 || ce.Code != "wrong_project" {
		t.Errorf("GET /metrics with a project's key of every scope: %d %s %q, want 403 wrong_project", status, ce.Code, ce.Message)
	}
	if status, ce := tcpCall(t, "GET", "/metrics", rkey, nil); status != 403 || ce.Code != "missing_scope" || !strings.Contains(ce.Message, "metrics:read") {
		t.Errorf("GET /metrics with sandbox:read: %d %s %q, want 403 missing_scope naming metrics:read", status, ce.Code, ce.Message)
	}
	if status, ce := tcpCall(t, "GET", "/metrics", "", nil); status != 401 {
		t.Errorf("GET /metrics without a key on --listen: %d %s, want 401", status, ce.Code)
	}

	src := create(t, client.CreateRequest{Image: busybox, Name: "metrics-src"})
	before := scrapeMetrics(t, e.metrics, "")
	fork, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{Name: "metrics-fork"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), fork.ID, true) })
	if _, err := e.c.Exec(ctxT(t), fork.ID, client.ExecRequest{Argv: []string{"sh", "-c", "exit 3"}}); err != nil {
		t.Fatal(err)
	}
	after := scrapeMetrics(t, e.metrics, "")
	grew := func(series string) {
		t.Helper()
		if after[series] < before[series]+1 {
			t.Errorf("%s: %v before the fork, %v after: want it counted", series, before[series], after[series])
		}
	}
	grew(`shard_operation_duration_seconds_count{op="fork",provider="gvisor",result="ok"}`)
	for _, phase := range []string{"freeze", "staging", "restore", "first_exec"} {
		grew(fmt.Sprintf(`shard_fork_phase_duration_seconds_count{phase=%q}`, phase))
	}
	grew(`shard_freeze_duration_seconds_count`)
	grew(`shard_exec_duration_seconds_count{exit="nonzero",provider="gvisor"}`)
	grew(`shard_exec_start_duration_seconds_count{provider="gvisor"}`)
	grew(`shard_api_requests_total{code="201",method="POST",route="POST /v0/sandboxes/{id}/fork"}`)
	grew(`shard_ledger_append_duration_seconds_count`)
	if n := after[`shard_sandboxes{provider="gvisor",state="running"}`]; n < 2 {
		t.Errorf("shard_sandboxes running gvisor = %v, want the source and its fork at least", n)
	}
	if after[`shard_operation_duration_seconds_sum{op="fork",provider="gvisor",result="ok"}`] <= before[`shard_operation_duration_seconds_sum{op="fork",provider="gvisor",result="ok"}`] {
		t.Errorf("the fork took no time in the histogram's sum")
	}
	for _, s := range []string{`shard_store_bytes{kind="capacity"}`, `shard_data_dir_bytes{kind="free"}`} {
		if after[s] <= 0 {
			t.Errorf("%s = %v, want > 0", s, after[s])
		}
	}
	if after[`shard_state_scrape_errors`] != 0 {
		t.Errorf("the scrape could not read the server's state (see the server log)")
	}

	// A failed call's id finds its line in the access log.
	req, _ := http.NewRequest("GET", "http://"+e.tcp+"/v0/sandboxes/metrics-no-such", nil)
	req.Header.Set("Authorization", "Bearer "+rkey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	id := resp.Header.Get("X-Request-Id")
	if resp.StatusCode != 404 || !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(id) {
		t.Fatalf("GET of a missing sandbox: %d, X-Request-Id %q", resp.StatusCode, id)
	}
	var line string
	for deadline := time.Now().Add(5 * time.Second); line == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(e.serveLog)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "request_id="+id) {
				line = l
			}
		}
	}
	for _, want := range []string{"msg=request", "status=404", `route="GET /v0/sandboxes/{id}"`, "key=metrics-sbread"} {
		if !strings.Contains(line, want) {
			t.Errorf("the access line of request %s lacks %s: %q", id, want, line)
		}
	}

	// The CLI's client carries the id of a failed call.
	_, err = e.c.Get(ctxT(t), "metrics-no-such")
	if ce, ok := err.(*client.Error); !ok || ce.RequestID == "" {
		t.Errorf("client error %v: want a *client.Error with its request id", err)
	}

	w := whoami(t, rkey)
	sort.Strings(w.Scopes)
	if w.Name != "metrics-sbread" || w.Project != "default" || strings.Join(w.Scopes, ",") != "sandbox:read" || w.AllProjects {
		t.Errorf("whoami = %+v", w)
	}
}

func whoami(t *testing.T, key string) client.Whoami {
	t.Helper()
	c, err := client.New(client.Options{Remote: "http://" + need(t).tcp, APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Whoami(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return *w
}
