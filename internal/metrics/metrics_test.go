package metrics

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A nil *Metrics counts nothing and never panics: services made by hand
// in unit tests carry none.
func TestNilIsANoOp(t *testing.T) {
	var m *Metrics
	m.Request("GET /v0/version", "GET", 200, time.Millisecond)
	m.Op("fork", "gvisor", time.Second, nil)
	m.ForkPhase("freeze", time.Millisecond)
	m.Freeze(time.Millisecond)
	m.ExecStarted("runc", time.Millisecond)
	m.ExecEnded("runc", ExitOK, time.Millisecond)
	m.OOMKills("gvisor", 2)
	m.Pull(10, nil)
	m.LedgerAppend(time.Millisecond)
	m.Register(nil)
}

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	w := httptest.NewRecorder()
	m.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(w.Result().Body)
	if w.Code != 200 {
		t.Fatalf("scrape: %d %s", w.Code, b)
	}
	return string(b)
}

func TestScrape(t *testing.T) {
	m := New("")
	m.Request("GET /v0/sandboxes/{id}", "GET", 404, 2*time.Millisecond)
	m.Op("fork", "gvisor", 300*time.Millisecond, nil)
	m.Op("create", "runc", time.Second, errors.New("x"))
	m.ForkPhase("staging", -time.Millisecond) // clamped, never negative
	m.ExecEnded("gvisor", ExitNonzero, time.Millisecond)
	m.OOMKills("gvisor", 0) // nothing to add: no series
	m.Pull(1234, nil)
	m.Watch(func() (State, error) {
		return State{Sandboxes: map[SandboxKey]int{{"running", "gvisor"}: 3, {"stopped", "runc"}: 0}, SparesReady: 1, AheadReady: 2,
			Store: map[string]int64{"free": 5}, DataDir: map[string]int64{"size": 9}}, nil
	})
	out := scrape(t, m)
	for _, want := range []string{
		`shard_api_requests_total{code="404",method="GET",route="GET /v0/sandboxes/{id}"} 1`,
		`shard_operation_duration_seconds_count{op="fork",provider="gvisor",result="ok"} 1`,
		`shard_operation_duration_seconds_count{op="create",provider="runc",result="error"} 1`,
		`shard_fork_phase_duration_seconds_sum{phase="staging"} 0`,
		`shard_exec_duration_seconds_count{exit="nonzero",provider="gvisor"} 1`,
		`shard_image_pull_bytes_total 1234`,
		`shard_image_pulls_total{result="ok"} 1`,
		`shard_sandboxes{provider="gvisor",state="running"} 3`,
		`shard_sandboxes{provider="runc",state="stopped"} 0`,
		`shard_warm_spares_ready 1`,
		`shard_sandboxes_ahead_ready 2`,
		`shard_store_bytes{kind="free"} 5`,
		`shard_data_dir_bytes{kind="size"} 9`,
		`shard_state_scrape_errors 0`,
		`go_goroutines`,
		`process_resident_memory_bytes`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if strings.Contains(out, "shard_oom_kills_total{") {
		t.Errorf("an OOM count of 0 made a series")
	}
}

// A provider that runs here has its OOM counter at 0 from the start, so
// rate() over it has a first sample before the first kill; kills add to it.
func TestProviderCountersStartAtZero(t *testing.T) {
	m := New("")
	m.Provider("gvisor")
	m.Provider("runc")
	m.OOMKills("runc", 2)
	out := scrape(t, m)
	for _, want := range []string{`shard_oom_kills_total{provider="gvisor"} 0`, `shard_oom_kills_total{provider="runc"} 2`} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	var nilM *Metrics
	nilM.Provider("gvisor") // no-op
}

// A state that cannot be read is said, and the rest is still served.
func TestScrapeStateError(t *testing.T) {
	m := New("")
	m.Watch(func() (State, error) { return State{SparesReady: 2}, errors.New("database locked") })
	out := scrape(t, m)
	for _, want := range []string{"shard_state_scrape_errors 1", "shard_warm_spares_ready 2"} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
}

// A status is a label only when HTTP defines it: the ports proxy answers
// with whatever status a sandbox's server sends (100 to 999), and each
// would otherwise be a series.
func TestRequestCodeLabelBounded(t *testing.T) {
	m := New("")
	for _, code := range []int{200, 418, 299, 599, 777, 999} {
		m.Request("/v0/sandboxes/{id}/ports/{port}/{path...}", "GET", code, time.Millisecond)
	}
	out := scrape(t, m)
	for _, want := range []string{`code="200"`, `code="418"`, `code="other",method="GET",route="/v0/sandboxes/{id}/ports/{port}/{path...}"} 4`} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	for _, bad := range []string{`code="299"`, `code="599"`, `code="777"`, `code="999"`} {
		if strings.Contains(out, bad) {
			t.Errorf("a status HTTP does not define became a label: %s", bad)
		}
	}
}

// Past four scrapes at once the next is refused (a flood on the keyless
// --metrics-listen does not pile up reads of the server's state).
func TestScrapesBounded(t *testing.T) {
	m := New("")
	entered, release := make(chan struct{}, 8), make(chan struct{})
	m.Watch(func() (State, error) {
		entered <- struct{}{}
		<-release
		return State{}, nil
	})
	done := make(chan int, 4)
	for i := 0; i < 4; i++ {
		go func() {
			w := httptest.NewRecorder()
			m.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
			done <- w.Code
		}()
	}
	for i := 0; i < 4; i++ {
		<-entered
	}
	w := httptest.NewRecorder()
	m.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != 503 {
		t.Errorf("a fifth scrape at once: %d, want 503", w.Code)
	}
	close(release)
	for i := 0; i < 4; i++ {
		if c := <-done; c != 200 {
			t.Errorf("a scrape within the bound: %d", c)
		}
	}
}

// In a cluster every series says its node, the scraped ones too.
func TestNodeLabel(t *testing.T) {
	m := New("node-a")
	m.Request("GET /v0/version", "GET", 200, time.Millisecond)
	m.Watch(func() (State, error) { return State{SparesReady: 2}, nil })
	out := scrape(t, m)
	for _, want := range []string{
		`shard_api_requests_total{code="200",method="GET",node="node-a",route="GET /v0/version"} 1`,
		`shard_warm_spares_ready{node="node-a"} 2`,
		`go_goroutines{node="node-a"}`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
}
