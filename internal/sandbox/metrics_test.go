package sandbox

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/metrics"
	"github.com/useshards/shard/internal/provider"
)

// The metrics name only the providers that run here: a provider listed as
// unavailable adds no always-zero sandboxes series, and the ones that run
// have their OOM counter at 0 before the first kill (rate() needs a first
// sample).
func TestMetricsOnlyProvidersHere(t *testing.T) {
	m := metrics.New("")
	f := newFakeService(t, func(c *Config) {
		c.Metrics = m
		c.Providers = append(c.Providers, &provider.Unavailable{Caps: provider.Capabilities{Name: "elsewhere", Reason: "not here"}})
	})
	f.create("one")
	st, err := f.svc.MetricsState()
	if err != nil {
		t.Fatal(err)
	}
	for k, n := range st.Sandboxes {
		if k.Provider != "fake" {
			t.Errorf("sandboxes of %s (state %s, %d): a provider that cannot run here has a series", k.Provider, k.State, n)
		}
	}
	for _, k := range []metrics.SandboxKey{{State: StateRunning, Provider: "fake"}, {State: StateStopped, Provider: "fake"}} {
		if _, ok := st.Sandboxes[k]; !ok {
			t.Errorf("no count of %+v: a provider that runs here has every state, zeros included", k)
		}
	}
	if n := st.Sandboxes[metrics.SandboxKey{State: StateRunning, Provider: "fake"}]; n != 1 {
		t.Errorf("running fake sandboxes: %d, want 1", n)
	}

	w := httptest.NewRecorder()
	m.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(w.Result().Body)
	out := string(b)
	if !strings.Contains(out, `shard_oom_kills_total{provider="fake"} 0`) {
		t.Errorf("no shard_oom_kills_total{provider=\"fake\"} 0 before any OOM kill:\n%s", grep(out, "shard_oom"))
	}
	if strings.Contains(out, `"elsewhere"`) {
		t.Errorf("a provider that cannot run here has series:\n%s", grep(out, "elsewhere"))
	}
}

// grep returns out's lines holding s.
func grep(out, s string) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}
