// Package metrics is what shard serve tells a Prometheus scraper: the
// sandboxes by state, how long lifecycle steps take, execs and how they
// ended, image pulls, API requests, the ledger's appends, disk and warm
// spares. One Metrics per server, handed to the parts that count (no
// global registry: a test runs servers side by side); every method is a
// no-op on a nil *Metrics, so a service made by hand in a unit test needs
// none.
package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Buckets of lifecycle steps: from a millisecond (a warm spare's create, an
// exec) to a minute (a create that pulls, a large checkpoint).
var opBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// Metrics holds the server's instruments.
type Metrics struct {
	reg     *prometheus.Registry
	into    prometheus.Registerer // reg, adding the node label in a cluster
	handler http.Handler

	requests   *prometheus.CounterVec
	requestDur *prometheus.HistogramVec
	ops        *prometheus.HistogramVec
	forkPhases *prometheus.HistogramVec
	freezes    prometheus.Histogram
	execStart  *prometheus.HistogramVec
	execs      *prometheus.HistogramVec
	ooms       *prometheus.CounterVec
	pulls      *prometheus.CounterVec
	pullBytes  prometheus.Counter
	ledger     prometheus.Histogram
	refused    prometheus.Counter
}

// New makes the instruments, with the Go runtime's and the process's. In
// a cluster every series carries node (one Prometheus scrapes every node,
// and their series must not collide); on a single host node is "".
func New(node string) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.into = m.reg
	if node != "" {
		m.into = prometheus.WrapRegistererWith(prometheus.Labels{"node": node}, m.reg)
	}
	f := func(c prometheus.Collector) { m.into.MustRegister(c) }
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shard_api_requests_total", Help: "API requests answered, by route pattern, method and HTTP status.",
	}, []string{"route", "method", "code"})
	m.requestDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "shard_api_request_duration_seconds", Help: "Time to answer an API request (to the end of its body: streams count whole), by route pattern.",
		Buckets: opBuckets,
	}, []string{"route"})
	m.ops = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "shard_operation_duration_seconds", Help: "Lifecycle steps from request to answer: create, fork, checkpoint, restore (result ok or error).",
		Buckets: opBuckets,
	}, []string{"op", "provider", "result"})
	m.forkPhases = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "shard_fork_phase_duration_seconds", Help: "A successful fork's phases: freeze (the source paused), staging (the forks' files and runtime after the thaw), restore (memory into the forks), first_exec (until the forks' agents answer).",
		Buckets: opBuckets,
	}, []string{"phase"})
	m.freezes = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "shard_freeze_duration_seconds", Help: "How long a running sandbox was held frozen for a fork or a checkpoint (count: the freezes).",
		Buckets: opBuckets,
	})
	m.execStart = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "shard_exec_start_duration_seconds", Help: "Time from an exec request to its command running in the sandbox.",
		Buckets: opBuckets,
	}, []string{"provider"})
	m.execs = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "shard_exec_duration_seconds", Help: "Commands run, by how they ended (ok, nonzero, signal, timeout, oom, error), and how long they ran (count: the execs).",
		Buckets: opBuckets,
	}, []string{"provider", "exit"})
	m.ooms = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shard_oom_kills_total", Help: "Processes killed for memory in sandboxes, counted when a sandbox's instance ends.",
	}, []string{"provider"})
	m.pulls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shard_image_pulls_total", Help: "Image pulls, by result (ok or error).",
	}, []string{"result"})
	m.pullBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "shard_image_pull_bytes_total", Help: "Layer bytes downloaded by image pulls (cached layers not counted).",
	})
	m.ledger = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "shard_ledger_append_duration_seconds", Help: "Time to append an event to the ledger, on disk.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
	})
	// No label per sandbox: sandboxes come and go, and each would be a
	// series for good; the ledger says which sandbox was refused.
	m.refused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "shard_sandbox_connections_refused_total", Help: "New connections of sandboxes refused by the connection bounds (shard serve --max-connections, the new-connection rates, the host table's hold), all sandboxes together.",
	})
	for _, c := range []prometheus.Collector{m.requests, m.requestDur, m.ops, m.forkPhases, m.freezes, m.execStart,
		m.execs, m.ooms, m.pulls, m.pullBytes, m.ledger, m.refused,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		f(c)
	}
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError,
		MaxRequestsInFlight: 4, Timeout: 10 * time.Second})
	return m
}

// Register adds a collector of figures read at scrape time (the
// sandboxes by state, disk, spares).
func (m *Metrics) Register(c prometheus.Collector) {
	if m != nil {
		m.into.MustRegister(c)
	}
}

// Handler serves the text format. Scrapes at once are few (one scraper,
// perhaps two): past four, the next is refused with a 503 rather than let
// a flood of them (--metrics-listen takes no key) eat the CPU the
// sandboxes' execs need.
// One handler serves every listener, so the bound is the server's.
func (m *Metrics) Handler() http.Handler { return m.handler }

// Request counts an answered API request. route is the pattern it matched
// (bounded: never the raw path, which a caller chooses).
func (m *Metrics) Request(route, method string, code int, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(route, method, codeLabel(code)).Inc()
	m.requestDur.WithLabelValues(route).Observe(d.Seconds())
}

// codeLabel is a status as a label: a status HTTP defines, else "other".
// A sandbox's server chooses the status the ports proxy answers with, any
// of 100 to 999: each would be a series of its own.
func codeLabel(code int) string {
	if http.StatusText(code) == "" {
		return "other"
	}
	return strconv.Itoa(code)
}

// Op observes a lifecycle step (create, fork, checkpoint, restore).
func (m *Metrics) Op(op, provider string, d time.Duration, err error) {
	if m == nil {
		return
	}
	m.ops.WithLabelValues(op, provider, result(err)).Observe(d.Seconds())
}

// ForkPhase observes one phase of a successful fork.
func (m *Metrics) ForkPhase(phase string, d time.Duration) {
	if m == nil {
		return
	}
	m.forkPhases.WithLabelValues(phase).Observe(max(d, 0).Seconds())
}

// Freeze observes how long a sandbox was held frozen.
func (m *Metrics) Freeze(d time.Duration) {
	if m != nil {
		m.freezes.Observe(d.Seconds())
	}
}

// ExecStarted observes the time until a command ran.
func (m *Metrics) ExecStarted(provider string, d time.Duration) {
	if m != nil {
		m.execStart.WithLabelValues(provider).Observe(d.Seconds())
	}
}

// Exit classes of a command.
const (
	ExitOK      = "ok"
	ExitNonzero = "nonzero"
	ExitSignal  = "signal"
	ExitTimeout = "timeout"
	ExitOOM     = "oom"
	ExitError   = "error" // it never ran, or the sandbox was lost under it
)

// ExecEnded observes a command that ended, by its exit class.
func (m *Metrics) ExecEnded(provider, exit string, d time.Duration) {
	if m != nil {
		m.execs.WithLabelValues(provider, exit).Observe(d.Seconds())
	}
}

// OOMKills adds processes killed for memory.
func (m *Metrics) OOMKills(provider string, n int64) {
	if m != nil && n > 0 {
		m.ooms.WithLabelValues(provider).Add(float64(n))
	}
}

// Provider names a provider that runs on this host: its counters start at
// 0, so rate() and increase() over them work from the first scrape rather
// than from the first event (a counter that appears at 1 loses that 1).
func (m *Metrics) Provider(name string) {
	if m != nil {
		m.ooms.WithLabelValues(name)
	}
}

// Pull counts an image pull and the layer bytes it downloaded.
func (m *Metrics) Pull(bytes int64, err error) {
	if m == nil {
		return
	}
	m.pulls.WithLabelValues(result(err)).Inc()
	if bytes > 0 {
		m.pullBytes.Add(float64(bytes))
	}
}

// ConnectionsRefused counts sandboxes' new connections refused.
func (m *Metrics) ConnectionsRefused(n uint64) {
	if m != nil && n > 0 {
		m.refused.Add(float64(n))
	}
}

// LedgerAppend observes an append to the ledger.
func (m *Metrics) LedgerAppend(d time.Duration) {
	if m != nil {
		m.ledger.Observe(d.Seconds())
	}
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// State is what a scrape reads of the server at that moment.
type State struct {
	Sandboxes   map[SandboxKey]int // every state × provider that runs here, zeros included
	SparesReady int                // environments' warm spares ready to be taken
	AheadReady  int                // sandboxes made ahead, ready for forks and restores
	Store       map[string]int64   // the sandbox store's bytes by kind (capacity, promised, meta, free)
	DataDir     map[string]int64   // the data directory's filesystem: size, free
}

// SandboxKey is a sandbox's state and provider.
type SandboxKey struct{ State, Provider string }

var (
	sandboxesDesc = prometheus.NewDesc("shard_sandboxes", "Sandboxes by state and provider.", []string{"state", "provider"}, nil)
	sparesDesc    = prometheus.NewDesc("shard_warm_spares_ready", "Environments' warm spares ready: a create from one only resumes it.", nil, nil)
	aheadDesc     = prometheus.NewDesc("shard_sandboxes_ahead_ready", "Sandboxes made ahead and waiting (serve --ahead): a fork or restore restores into one instead of creating its sandbox.", nil, nil)
	storeDesc     = prometheus.NewDesc("shard_store_bytes", "The sandbox store (the sandboxes' files): its filesystem's capacity, what is promised to sandboxes' bounds and saved copies, its metadata and margin, and what is still free to promise.", []string{"kind"}, nil)
	dataDirDesc   = prometheus.NewDesc("shard_data_dir_bytes", "The filesystem of the data directory (database, images, checkpoints): size and free.", []string{"kind"}, nil)
	scrapeErrDesc = prometheus.NewDesc("shard_state_scrape_errors", "1 when the scrape could not read the server's state (see the log).", nil, nil)
)

// stateCollector reads a State at each scrape.
type stateCollector struct {
	read func() (State, error)
}

// Watch has each scrape read the server's state through read.
func (m *Metrics) Watch(read func() (State, error)) { m.Register(stateCollector{read}) }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sandboxesDesc, sparesDesc, aheadDesc, storeDesc, dataDirDesc, scrapeErrDesc} {
		ch <- d
	}
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	st, err := c.read()
	failed := 0.0
	if err != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(scrapeErrDesc, prometheus.GaugeValue, failed)
	for k, n := range st.Sandboxes {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), k.State, k.Provider)
	}
	ch <- prometheus.MustNewConstMetric(sparesDesc, prometheus.GaugeValue, float64(st.SparesReady))
	ch <- prometheus.MustNewConstMetric(aheadDesc, prometheus.GaugeValue, float64(st.AheadReady))
	for k, n := range st.Store {
		ch <- prometheus.MustNewConstMetric(storeDesc, prometheus.GaugeValue, float64(n), k)
	}
	for k, n := range st.DataDir {
		ch <- prometheus.MustNewConstMetric(dataDirDesc, prometheus.GaugeValue, float64(n), k)
	}
}
