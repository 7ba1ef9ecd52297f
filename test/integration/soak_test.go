package integration

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// TestSoak drives the real server with concurrent random operations for a
// while (SHARD_SOAK_DURATION, default 3m; SHARD_SOAK_SEED repeats a run's
// choices): creates on both providers, execs (with stdin, writing files,
// failing), forks (some of two), checkpoints, restores, snapshots of stopped
// sandboxes and creates from them, stops, starts, policies and removals,
// while the server is killed with SIGKILL every 20-40 s and started again.
// Errors while the server is down, or about an operation it was killed
// under, are expected; everything else is looked at. Afterwards:
//
//   - every acknowledged operation is in the ledger (each create, exec with
//     its exit code, fork, checkpoint, restore, snapshot, stop, start,
//     policy and removal that was answered);
//   - no sandbox is stuck in a transitional state or failed, none that was
//     running died while the server was down, the host agrees with the
//     listing (a stopped sandbox holds no container, mount, namespace...; a
//     running one has its container; checkpoints and snapshots have their
//     files), and every running sandbox answers an exec and still has the
//     files acknowledged written into it;
//   - once everything is removed through the API, nothing is left on the
//     host: containers, processes, mounts, loop devices, namespaces, veths,
//     nftables entries, cgroups, files, RAM images.
//
// The figures (operations by kind, kills, leaks) are logged at the end.
func TestSoak(t *testing.T) {
	e := need(t)
	dur := 3 * time.Minute
	if v := os.Getenv("SHARD_SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("SHARD_SOAK_DURATION=%q: want a positive duration such as 3m", v)
		}
		dur = d
	}
	seed := time.Now().UnixNano() % 1_000_000_000
	if v := os.Getenv("SHARD_SOAK_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("SHARD_SOAK_SEED=%q: want an integer", v)
		}
		seed = n
	}
	t.Logf("soak: seed %d (SHARD_SOAK_SEED=%d repeats its choices), %v of load, %d workers", seed, seed, dur, soakWorkers)

	// A client of the test's own: the harness's is replaced at each restart.
	c, err := client.New(client.Options{Socket: e.socket})
	if err != nil {
		t.Fatal(err)
	}
	caps, err := c.Capabilities(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	s := &soak{t: t, e: e, c: c, sbs: map[string]*soakSB{}, ops: map[string]*soakOpStats{}, inflight: map[string]int{}, aimed: map[string]int{}}
	for _, cp := range caps {
		if cp.Name == "gvisor" && cp.Available && cp.Fork && cp.Checkpoint {
			s.canFork = true
		}
	}
	if !s.canFork {
		t.Fatalf("gvisor cannot fork here: %+v", caps)
	}
	// What was there before: artifacts of earlier tests are not the
	// soak's, and its sandboxes are those of the sessions made from now on.
	sessions, err := c.Sessions(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	s.baseSessions = map[string]bool{}
	for _, ss := range sessions {
		s.baseSessions[ss.Name] = true
	}
	s.baseline = map[string]bool{}
	for _, a := range s.artifacts(nil) {
		s.baseline[a.desc] = true
	}
	if s.basePromised, err = s.promised(); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(e.serveLog); err == nil {
		s.logFrom = st.Size()
	}

	// Load.
	s.start = time.Now()
	s.deadline = s.start.Add(dur)
	var wg sync.WaitGroup
	for w := range soakWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.worker(w, rand.New(rand.NewSource(seed+int64(w)+1)))
		}()
	}
	killerDone := make(chan struct{})
	go func() {
		defer close(killerDone)
		s.killer(rand.New(rand.NewSource(seed)))
	}()
	wg.Wait()
	<-killerDone
	if s.restartErr != nil {
		// The killer could not bring the server back: once more, or the
		// tests after this one have no server.
		if err := e.startServer(); err != nil {
			t.Fatalf("the server did not come back after kill %d: %v (and again: %v)", s.kills, s.restartErr, err)
		}
		t.Errorf("the server did not come back after kill %d at the first try: %v", s.kills, s.restartErr)
	}
	s.logf("load over after %v: %d kills", time.Since(s.start).Round(time.Second), s.kills)

	leaks := -1
	defer func() { s.figures(leaks) }()
	s.checkSettled()
	s.checkConsistent()
	s.checkRunningAnswer()
	s.removeAll()
	s.checkLedger()
	leaks = s.checkLeaks()
	s.checkServeLog()
	if _, err := c.Capabilities(ctxT(t)); err != nil {
		t.Errorf("the server is not healthy at the end: %v", err)
	}
}

const (
	soakWorkers   = 5
	soakMaxLive   = 9 // sandboxes of the soak at once
	soakMaxCks    = 5 // checkpoints of the soak kept (forks' included)
	soakMaxSnaps  = 3
	soakOpTimeout = 3 * time.Minute // per operation: the host is shared, and slow
	// An operation that started before the server was back is in the kill's
	// window; one that started after it answered again is not (a second's
	// slack for the clocks of the goroutines).
	soakRestartLag = time.Second
)

// soakSB is a sandbox of the soak as the test knows it.
type soakSB struct {
	id, name, provider, session string
	state                       string   // last known: running or stopped
	busy                        int      // lifecycle operations holding it
	files                       []string // written under /root by acknowledged execs
	stops, starts               int      // acknowledged
}

// soakAck is an acknowledged operation and what the ledger must show of it.
type soakAck struct {
	kind, what string
	check      func(ev func(session string) ([]client.Event, error)) error
}

type soakOpStats struct {
	attempted, acked, refused, inWindow, unexpected int
	refusals                                        map[string]int // by code
}

type soakWindow struct{ from, to time.Time }

type soak struct {
	t        *testing.T
	e        *env
	c        *client.Client
	canFork  bool
	start    time.Time
	deadline time.Time
	logFrom  int64

	baseSessions map[string]bool
	baseline     map[string]bool // artifact descriptions present before the soak
	basePromised int64           // the store's promises before the soak

	seq atomic.Int64 // names and exec markers

	mu         sync.Mutex
	sbs        map[string]*soakSB
	acks       []soakAck
	ops        map[string]*soakOpStats
	problems   []string       // unexpected errors, for the log
	inflight   map[string]int // operations under way, by kind
	aimed      map[string]int // operations under way at the kills, by kind
	windows    []soakWindow
	down       bool
	downSince  time.Time
	kills      int
	restartErr error
	restarts   []time.Duration
}

func (s *soak) logf(format string, args ...any) {
	s.t.Logf("soak %6.1fs: %s", time.Since(s.start).Seconds(), fmt.Sprintf(format, args...))
}

func (s *soak) next(prefix string) string { return fmt.Sprintf("%s%d", prefix, s.seq.Add(1)) }

// killer kills the server with SIGKILL every 20-40 s, while operations are
// in flight, and starts it again.
func (s *soak) killer(rng *rand.Rand) {
	for {
		wait := 20*time.Second + time.Duration(rng.Int63n(int64(20*time.Second)))
		at := time.Now().Add(wait)
		if at.After(s.deadline.Add(-15 * time.Second)) {
			return // the last stretch runs undisturbed, for operations after a restart
		}
		time.Sleep(time.Until(at))
		// Aim: wait a moment for an operation of a kind picked at random
		// to be under way, and kill within its first second, so that
		// kills land inside forks, checkpoints, restores... and not only
		// between execs.
		aim := soakAims[rng.Intn(len(soakAims))]
		into := time.Duration(rng.Int63n(int64(time.Second)))
		caught := ""
		for wait := time.Now().Add(5 * time.Second); caught == "" && time.Now().Before(wait); {
			if caught = s.underway(aim); caught == "" {
				time.Sleep(20 * time.Millisecond)
			}
		}
		if caught != "" {
			time.Sleep(into)
		}
		s.mu.Lock()
		s.down, s.downSince = true, time.Now()
		s.kills++
		n := s.kills
		var under []string
		for k, v := range s.inflight {
			if v > 0 {
				under = append(under, fmt.Sprintf("%s:%d", k, v))
				s.aimed[k] += v
			}
		}
		s.mu.Unlock()
		sort.Strings(under)
		s.logf("kill -9 #%d of the server (aimed at %q), under way: %s", n, aim, strings.Join(under, " "))
		s.e.killServer()
		time.Sleep(time.Duration(rng.Int63n(int64(1500 * time.Millisecond))))
		t0 := time.Now()
		err := s.e.startServer()
		if err != nil {
			s.logf("restart after kill #%d failed: %v; once more", n, err)
			if s.e.server != nil && s.e.server.Process != nil {
				s.e.killServer()
			}
			err = s.e.startServer()
		}
		s.mu.Lock()
		s.down = false
		s.windows = append(s.windows, soakWindow{s.downSince, time.Now().Add(soakRestartLag)})
		s.restarts = append(s.restarts, time.Since(t0))
		if err != nil {
			s.restartErr = err
		}
		s.mu.Unlock()
		if err != nil {
			s.logf("the server did not come back after kill #%d: %v", n, err)
			s.mu.Lock()
			s.deadline = time.Now() // stop the load
			s.mu.Unlock()
			return
		}
		s.logf("server back after kill #%d (start took %v)", n, time.Since(t0).Round(time.Millisecond))
		s.refresh()
	}
}

// soakAims are the kinds of operations the killer waits for ("" any).
var soakAims = []string{"", "fork", "checkpoint", "restore", "create", "stop", "start", "remove", "snapshot", "exec"}

// underway returns a kind of operation under way that starts with prefix.
func (s *soak) underway(prefix string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ks []string
	for k, v := range s.inflight {
		if v > 0 && strings.HasPrefix(k, prefix) {
			ks = append(ks, k)
		}
	}
	if len(ks) == 0 {
		return ""
	}
	sort.Strings(ks)
	return ks[0]
}

// inWindow says whether an operation that ran from start to now overlapped
// a kill: its errors are then expected.
func (s *soak) inWindow(start time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return true
	}
	now := time.Now()
	for _, w := range s.windows {
		if start.Before(w.to) && now.After(w.from) {
			return true
		}
	}
	return false
}

func (s *soak) over() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Now().After(s.deadline)
}

// refresh brings the test's view in line with the server's after a
// restart: reconcile may have stopped sandboxes, finished removals, or a
// create may have been done whose answer the kill lost.
func (s *soak) refresh() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	all, err := s.c.List(ctx)
	if err != nil {
		return
	}
	listed := map[string]client.Sandbox{}
	for _, sb := range all {
		if strings.HasPrefix(sb.Name, "soak-") {
			listed[sb.ID] = sb
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, sb := range s.sbs {
		l, ok := listed[id]
		if !ok {
			if sb.busy == 0 {
				delete(s.sbs, id)
			}
			continue
		}
		if sb.busy == 0 && (l.State == "running" || l.State == "stopped") {
			sb.state = l.State
		}
	}
	for id, l := range listed {
		if _, ok := s.sbs[id]; !ok {
			s.sbs[id] = &soakSB{id: id, name: l.Name, provider: l.Provider, session: l.Session, state: l.State}
		}
	}
}

// begin marks an operation of kind in flight (for the killer to aim at);
// op ends it.
func (s *soak) begin(kind string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight[kind]++
	return time.Now()
}

// op counts an attempt of kind and, when err is set, classifies it: a
// refusal (4xx but 400), an error the kill explains, or a problem.
func (s *soak) op(kind string, start time.Time, err error) {
	s.mu.Lock()
	if s.inflight[kind] > 0 {
		s.inflight[kind]--
	}
	st := s.ops[kind]
	if st == nil {
		st = &soakOpStats{refusals: map[string]int{}}
		s.ops[kind] = st
	}
	st.attempted++
	s.mu.Unlock()
	if err == nil {
		s.mu.Lock()
		st.acked++
		s.mu.Unlock()
		return
	}
	var ce *client.Error
	isAPI := errors.As(err, &ce)
	window := s.inWindow(start)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case isAPI && ce.Status >= 400 && ce.Status < 500 && ce.Status != 400:
		st.refused++
		st.refusals[ce.Code]++
	case window:
		st.inWindow++
	default:
		st.unexpected++
		msg := err.Error()
		if isAPI {
			msg = fmt.Sprintf("%d %s: %s", ce.Status, ce.Code, ce.Message)
		}
		s.problems = append(s.problems, fmt.Sprintf("%6.1fs %s: %s", time.Since(s.start).Seconds(), kind, msg))
	}
}

// problem records something wrong that is no error of the API (a wrong
// output, say).
func (s *soak) problem(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.problems = append(s.problems, fmt.Sprintf("%6.1fs ", time.Since(s.start).Seconds())+fmt.Sprintf(format, args...))
}

func (s *soak) ack(kind, what string, check func(ev func(string) ([]client.Event, error)) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acks = append(s.acks, soakAck{kind, what, check})
}

// pick chooses one of the sandboxes that pass keep, in a stable order so
// that the seed decides; with claim it holds it (busy) until release. A
// claim mostly takes a sandbox no other lifecycle operation holds, but one
// in six barges in: the server must serialise a stop, fork, checkpoint,
// snapshot, policy or removal of one sandbox by itself.
func (s *soak) pick(rng *rand.Rand, claim bool, keep func(*soakSB) bool) *soakSB {
	barge := claim && rng.Intn(6) == 0
	s.mu.Lock()
	defer s.mu.Unlock()
	var c []*soakSB
	for _, sb := range s.sbs {
		if (!claim || barge || sb.busy == 0) && keep(sb) {
			c = append(c, sb)
		}
	}
	if len(c) == 0 {
		return nil
	}
	sort.Slice(c, func(i, j int) bool { return c[i].name < c[j].name })
	sb := c[rng.Intn(len(c))]
	if claim {
		sb.busy++
	}
	return sb
}

func (s *soak) release(sb *soakSB) {
	s.mu.Lock()
	sb.busy--
	s.mu.Unlock()
}

func (s *soak) live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sbs)
}

func (s *soak) add(sb *client.Sandbox) *soakSB {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := &soakSB{id: sb.ID, name: sb.Name, provider: sb.Provider, session: sb.Session, state: sb.State}
	s.sbs[sb.ID] = n
	return n
}

// settle updates what is known of sb after an error: gone (404), or in
// another state than thought.
func (s *soak) settle(sb *soakSB, err error) {
	var ce *client.Error
	if !errors.As(err, &ce) {
		return
	}
	if ce.Status == 404 {
		s.mu.Lock()
		delete(s.sbs, sb.id)
		s.mu.Unlock()
		return
	}
	if ce.Status != 409 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cur, gerr := s.c.Get(ctx, sb.id)
	s.mu.Lock()
	defer s.mu.Unlock()
	var ge *client.Error
	switch {
	case errors.As(gerr, &ge) && ge.Status == 404:
		delete(s.sbs, sb.id)
	case gerr == nil && (cur.State == "running" || cur.State == "stopped"):
		sb.state = cur.State
	}
}

func opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), soakOpTimeout)
}

// worker does random operations until the deadline.
func (s *soak) worker(w int, rng *rand.Rand) {
	type choice struct {
		weight int
		do     func(*rand.Rand) bool // false: nothing to do it on
	}
	choices := []choice{
		{34, s.doExec}, {12, s.doCreate}, {9, s.doFork}, {6, s.doCheckpoint}, {6, s.doRestore},
		{8, s.doStop}, {8, s.doStart}, {5, s.doSnapshot}, {3, s.doPolicy}, {8, s.doRemove},
		{3, s.doRemoveCheckpoint}, {2, s.doRemoveSnapshot},
	}
	total := 0
	for _, c := range choices {
		total += c.weight
	}
	for !s.over() {
		// While the server is down nothing is sent: the kill's window is
		// about the operations it caught in flight, and those right after.
		for s.isDown() && !s.over() {
			time.Sleep(100 * time.Millisecond)
		}
		if s.live() < 3 && rng.Intn(2) == 0 {
			if s.doCreate(rng) {
				continue
			}
		}
		n := rng.Intn(total)
		for _, c := range choices {
			if n -= c.weight; n < 0 {
				if !c.do(rng) {
					time.Sleep(20 * time.Millisecond)
				}
				break
			}
		}
	}
}

func (s *soak) isDown() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.down
}

var soakMem, soakDisk = jsonRaw("128MiB"), jsonRaw("256MiB")

func (s *soak) doCreate(rng *rand.Rand) bool {
	if s.live() >= soakMaxLive {
		return false
	}
	prov := "gvisor"
	if rng.Intn(5) < 2 {
		prov = "runc"
	}
	req := client.CreateRequest{Image: busybox, Name: s.next("soak-c"), Memory: soakMem, Disk: soakDisk, Provider: prov}
	kind := "create/" + prov
	var snap string
	if rng.Intn(4) == 0 {
		ctx, cancel := opCtx()
		sns, err := s.c.Snapshots(ctx)
		cancel()
		var ours []string
		for _, sn := range sns {
			if strings.HasPrefix(sn.Name, "soak-") {
				ours = append(ours, sn.ID)
			}
		}
		if err == nil && len(ours) > 0 {
			slices.Sort(ours)
			snap = ours[rng.Intn(len(ours))]
			req.Image, req.Disk, req.FromSnapshot = "", nil, snap
			kind = "create-from-snapshot/" + prov
		}
	}
	ctx, cancel := opCtx()
	defer cancel()
	start := s.begin(kind)
	sb, err := s.c.Create(ctx, req)
	s.op(kind, start, err)
	if err != nil {
		return true
	}
	s.add(sb)
	s.ackCreated(kind, sb, "from_snapshot", snap)
	return true
}

// ackCreated: sb's session has its sandbox.created (with key=value in its
// data, if key is set).
func (s *soak) ackCreated(kind string, sb *client.Sandbox, key, value string) {
	id, session := sb.ID, sb.Session
	s.ack(kind, fmt.Sprintf("sandbox.created of %s (%s) in session %s", sb.Name, id, session), func(ev func(string) ([]client.Event, error)) error {
		evs, err := ev(session)
		if err != nil {
			return err
		}
		for _, x := range evs {
			if x.Type == "sandbox.created" && x.SandboxID == id && (key == "" || value == "" || soakField(x, key) == value) {
				return nil
			}
		}
		return fmt.Errorf("no sandbox.created for %s%s", id, soakIf(key != "" && value != "", fmt.Sprintf(" with %s=%s", key, value)))
	})
}

func soakIf(c bool, s string) string {
	if c {
		return s
	}
	return ""
}

func soakField(ev client.Event, key string) string {
	var m map[string]any
	json.Unmarshal(ev.Data, &m)
	switch v := m[key].(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case nil:
		return ""
	default:
		b, _ := json.Marshal(v)
		return string(b)
	}
}

func (s *soak) doExec(rng *rand.Rand) bool {
	sb := s.pick(rng, false, func(sb *soakSB) bool { return sb.state == "running" })
	if sb == nil {
		return false
	}
	marker := s.next("soak-x")
	var script, wantOut string
	var stdin *string
	wantCode := 0
	file := ""
	kind := "exec"
	switch rng.Intn(6) {
	case 0, 1:
		script, wantOut = `echo "$0"`, marker+"\n"
	case 2:
		kind = "exec/stdin"
		in := marker + "\nsecond line\n"
		b := base64.StdEncoding.EncodeToString([]byte(in))
		stdin = &b
		script, wantOut = "cat", in
	case 3:
		kind = "exec/write-file"
		file = "/root/" + marker
		script, wantOut = `echo "$0" > /root/"$0" && cat /root/"$0"`, marker+"\n"
	case 4:
		kind = "exec/exit-code"
		wantCode = 1 + rng.Intn(5)
		script = fmt.Sprintf(`echo "$0" >&2; exit %d`, wantCode)
	case 5:
		if rng.Intn(3) == 0 {
			kind = "exec/background"
			script = `sleep 3600 >/dev/null 2>&1 &`
		} else {
			kind = "exec/sleep"
			script, wantOut = `sleep 0.3; echo "$0"`, marker+"\n"
		}
	}
	argv := []string{"sh", "-c", script, marker}
	ctx, cancel := opCtx()
	defer cancel()
	start := s.begin(kind)
	res, err := s.c.Exec(ctx, sb.id, client.ExecRequest{Argv: argv, Stdin: stdin})
	s.op(kind, start, err)
	if err != nil {
		s.settle(sb, err)
		return true
	}
	code := res.ExitCode
	session := sb.session
	s.ack(kind, fmt.Sprintf("exec %q in %s (session %s) exit %d", marker, sb.name, session, code), func(ev func(string) ([]client.Event, error)) error {
		evs, err := ev(session)
		if err != nil {
			return err
		}
		execID := ""
		for _, x := range evs {
			if x.Type == "sandbox.exec_started" && soakField(x, "argv") == soakJSON(argv) {
				execID = soakField(x, "exec")
			}
		}
		if execID == "" {
			return fmt.Errorf("no sandbox.exec_started with argv %s", soakJSON(argv))
		}
		for _, x := range evs {
			if x.Type == "sandbox.exec_finished" && soakField(x, "exec") == execID {
				if got := soakField(x, "exit_code"); got != strconv.Itoa(code) {
					return fmt.Errorf("sandbox.exec_finished of exec %s has exit_code %q, the client was told %d", execID, got, code)
				}
				return nil
			}
		}
		return fmt.Errorf("sandbox.exec_started %s but no sandbox.exec_finished (the client was told exit %d)", execID, code)
	})
	if res.Error != "" || res.Signal != 0 {
		// Ended by the host (a stop or removal meanwhile): said so, fine.
		return true
	}
	if code != wantCode || (wantOut != "" && string(res.Stdout) != wantOut) {
		// The ledger's record of the exec says which side lost what: the
		// bytes the sandbox saw go in and come out.
		s.problem("%s %q in %s (%s): exit %d stdout %q stderr %q; want exit %d stdout %q; the ledger: %s", kind, marker, sb.name, sb.id, code, res.Stdout, res.Stderr, wantCode, wantOut, s.execRecord(session, argv))
		return true
	}
	if file != "" {
		s.mu.Lock()
		sb.files = append(sb.files, file)
		s.mu.Unlock()
	}
	return true
}

// execRecord is the data of the ledger's exec_started and exec_finished of
// the exec of argv in session, for a report.
func (s *soak) execRecord(session string, argv []string) string {
	ctx, cancel := opCtx()
	defer cancel()
	var evs []client.Event
	for after := int64(0); ; {
		page, err := s.c.Events(ctx, session, after, 1000)
		if err != nil {
			return "(events: " + err.Error() + ")"
		}
		evs = append(evs, page.Events...)
		if !page.More {
			break
		}
		after = page.Next
	}
	execID, out := "", ""
	for _, x := range evs {
		if x.Type == "sandbox.exec_started" && soakField(x, "argv") == soakJSON(argv) {
			execID, out = soakField(x, "exec"), "started "+string(x.Data)
		}
	}
	for _, x := range evs {
		if execID != "" && x.Type == "sandbox.exec_finished" && soakField(x, "exec") == execID {
			out += ", finished " + string(x.Data)
		}
	}
	if out == "" {
		return "(no exec_started)"
	}
	return out
}

func soakJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func (s *soak) doFork(rng *rand.Rand) bool {
	count := 1
	if rng.Intn(10) < 3 {
		count = 2
	}
	if s.live()+count > soakMaxLive {
		return false
	}
	src := s.pick(rng, true, func(sb *soakSB) bool { return sb.state == "running" && sb.provider == "gvisor" })
	if src == nil {
		return false
	}
	defer s.release(src)
	name := s.next("soak-f")
	kind := "fork"
	if count > 1 {
		kind = "fork/count-2"
	}
	ctx, cancel := opCtx()
	defer cancel()
	start := s.begin(kind)
	forks, err := s.c.ForkMany(ctx, src.id, client.ForkRequest{Name: name, Count: count, Tag: "soak"})
	if err == nil && len(forks) != count {
		err = fmt.Errorf("fork --count %d answered %d sandboxes", count, len(forks))
		s.problem("%s of %s: %v", kind, src.name, err)
	}
	s.op(kind, start, err)
	if err != nil {
		s.settle(src, err)
		return true
	}
	srcID, srcSession := src.id, src.session
	for i := range forks {
		f := &forks[i]
		s.add(f)
		s.ackCreated(kind, f, "forked_from", srcID)
		fid, fsession := f.ID, f.Session
		s.ack(kind, fmt.Sprintf("sandbox.forked (fork %s) and its sandbox.checkpoint_created in session %s", f.Name, srcSession), func(ev func(string) ([]client.Event, error)) error {
			fevs, err := ev(fsession)
			if err != nil {
				return err
			}
			ck := ""
			for _, x := range fevs {
				if x.Type == "sandbox.created" {
					ck = soakField(x, "checkpoint")
				}
			}
			evs, err := ev(srcSession)
			if err != nil {
				return err
			}
			forked, cked := false, false
			for _, x := range evs {
				forked = forked || (x.Type == "sandbox.forked" && soakField(x, "fork") == fid)
				cked = cked || (x.Type == "sandbox.checkpoint_created" && ck != "" && soakField(x, "checkpoint") == ck)
			}
			if !forked || !cked {
				return fmt.Errorf("sandbox.forked for %s: %v; sandbox.checkpoint_created of checkpoint %q: %v", fid, forked, ck, cked)
			}
			return nil
		})
	}
	return true
}

func (s *soak) doCheckpoint(rng *rand.Rand) bool {
	if n, _ := s.ourCheckpoints(); len(n) >= soakMaxCks {
		return s.doRemoveCheckpoint(rng)
	}
	src := s.pick(rng, true, func(sb *soakSB) bool { return sb.state == "running" && sb.provider == "gvisor" })
	if src == nil {
		return false
	}
	defer s.release(src)
	ctx, cancel := opCtx()
	defer cancel()
	start := s.begin("checkpoint")
	ck, err := s.c.Checkpoint(ctx, src.id, client.CheckpointRequest{Tag: "soak"})
	s.op("checkpoint", start, err)
	if err != nil {
		s.settle(src, err)
		return true
	}
	ckID, session := ck.ID, ck.Session
	s.ack("checkpoint", fmt.Sprintf("sandbox.checkpoint_created of %s in session %s", ckID, session), func(ev func(string) ([]client.Event, error)) error {
		evs, err := ev(session)
		if err != nil {
			return err
		}
		for _, x := range evs {
			if x.Type == "sandbox.checkpoint_created" && soakField(x, "checkpoint") == ckID {
				return nil
			}
		}
		return fmt.Errorf("no sandbox.checkpoint_created for %s", ckID)
	})
	return true
}

// ourCheckpoints lists the soak's checkpoints (taken by hand or by forks).
func (s *soak) ourCheckpoints() ([]client.Checkpoint, error) {
	ctx, cancel := opCtx()
	defer cancel()
	all, err := s.c.AllCheckpoints(ctx)
	var out []client.Checkpoint
	for _, ck := range all {
		if strings.HasPrefix(ck.SandboxName, "soak-") {
			out = append(out, ck)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, err
}

func (s *soak) doRestore(rng *rand.Rand) bool {
	if s.live() >= soakMaxLive {
		return false
	}
	cks, err := s.ourCheckpoints()
	if err != nil || len(cks) == 0 {
		return false
	}
	ck := cks[rng.Intn(len(cks))]
	ctx, cancel := opCtx()
	defer cancel()
	start := s.begin("restore")
	sb, err := s.c.RestoreCheckpoint(ctx, ck.ID, client.RestoreRequest{Name: s.next("soak-r")})
	s.op("restore", start, err)
	if err != nil {
		return true
	}
	s.add(sb)
	s.ackCreated("restore", sb, "restored_from", ck.ID)
	return true
}

func (s *soak) doStop(rng *rand.Rand) bool {
	sb := s.pick(rng, true, func(sb *soakSB) bool { return sb.state == "running" })
	if sb == nil {
		return false
	}
	defer s.release(sb)
	ctx, cancel := opCtx()
	defer cancel()
	start := s.begin("stop")
	_, err := s.c.Stop(ctx, sb.id)
	s.op("stop", start, err)
	if err != nil {
		s.settle(sb, err)
		return true
	}
	s.mu.Lock()
	sb.state = "stopped"
	sb.stops++
	n := sb.stops
	s.mu.Unlock()
	s.ackCount("stop", sb, "sandbox.stopped", n)
	return true
}

func (s *soak) doStart(rng *rand.Rand) bool {
	sb := s.pick(rng, true, func(sb *soakSB) bool { return sb.state == "stopped" })
	if sb == nil {
		return false
	}
	defer s.release(sb)
	ctx, cancel := opCtx()
	defer cancel()
	start := s.begin("start")
	_, err := s.c.Start(ctx, sb.id)
	s.op("start", start, err)
	if err != nil {
		s.settle(sb, err)
		return true
	}
	s.mu.Lock()
	sb.state = "running"
	sb.starts++
	n := sb.starts
	s.mu.Unlock()
	s.ackCount("start", sb, "sandbox.started", n)
	return true
}

// ackCount: sb's session has at least n events of type typ (stops and
// starts are counted: reconcile may add stops of its own).
func (s *soak) ackCount(kind string, sb *soakSB, typ string, n int) {
	session, id := sb.session, sb.id
	s.ack(kind, fmt.Sprintf("%s #%d of %s in session %s", typ, n, sb.name, session), func(ev func(string) ([]client.Event, error)) error {
		evs, err := ev(session)
		if err != nil {
			return err
		}
		got := 0
		for _, x := range evs {
			if x.Type == typ && x.SandboxID == id {
				got++
			}
		}
		if got < n {
			return fmt.Errorf("%d %s events, %d acknowledged", got, typ, n)
		}
		return nil
	})
}

func (s *soak) doSnapshot(rng *rand.Rand) bool {
	ctx, cancel := opCtx()
	defer cancel()
	if sns, err := s.c.Snapshots(ctx); err == nil {
		n := 0
		for _, sn := range sns {
			if strings.HasPrefix(sn.Name, "soak-") {
				n++
			}
		}
		if n >= soakMaxSnaps {
			return s.doRemoveSnapshot(rng)
		}
	}
	sb := s.pick(rng, true, func(sb *soakSB) bool { return sb.state == "stopped" })
	if sb == nil {
		return false
	}
	defer s.release(sb)
	start := s.begin("snapshot")
	sn, err := s.c.CreateSnapshot(ctx, client.SnapshotRequest{Sandbox: sb.id, Name: s.next("soak-s")})
	s.op("snapshot", start, err)
	if err != nil {
		s.settle(sb, err)
		return true
	}
	snID, session := sn.ID, sb.session
	s.ack("snapshot", fmt.Sprintf("sandbox.snapshot_created of %s in session %s", snID, session), func(ev func(string) ([]client.Event, error)) error {
		evs, err := ev(session)
		if err != nil {
			return err
		}
		for _, x := range evs {
			if x.Type == "sandbox.snapshot_created" && soakField(x, "snapshot") == snID {
				return nil
			}
		}
		return fmt.Errorf("no sandbox.snapshot_created for %s", snID)
	})
	return true
}

// doPolicy sets a deny policy (addresses only, no DNS): it puts a chain and
// sets in the nftables table, which must go with the sandbox.
func (s *soak) doPolicy(rng *rand.Rand) bool {
	sb := s.pick(rng, true, func(sb *soakSB) bool { return true })
	if sb == nil {
		return false
	}
	defer s.release(sb)
	ctx, cancel := opCtx()
	defer cancel()
	deny := fmt.Sprintf("203.0.113.%d", 1+rng.Intn(250))
	start := s.begin("policy")
	_, err := s.c.SetPolicy(ctx, sb.id, client.Policy{Deny: []string{deny}})
	s.op("policy", start, err)
	if err != nil {
		s.settle(sb, err)
		return true
	}
	session, id := sb.session, sb.id
	s.ack("policy", fmt.Sprintf("sandbox.policy_set (deny %s) of %s in session %s", deny, sb.name, session), func(ev func(string) ([]client.Event, error)) error {
		evs, err := ev(session)
		if err != nil {
			return err
		}
		for _, x := range evs {
			if x.Type == "sandbox.policy_set" && x.SandboxID == id && strings.Contains(string(x.Data), deny) {
				return nil
			}
		}
		return fmt.Errorf("no sandbox.policy_set denying %s", deny)
	})
	return true
}

func (s *soak) doRemove(rng *rand.Rand) bool {
	if s.live() <= 2 {
		return false
	}
	sb := s.pick(rng, true, func(sb *soakSB) bool { return true })
	if sb == nil {
		return false
	}
	defer s.release(sb)
	s.remove("remove", sb)
	return true
}

// remove removes sb (force) and, when that is acknowledged, expects its
// sandbox.removed. It reports whether it is gone.
func (s *soak) remove(kind string, sb *soakSB) bool {
	ctx, cancel := opCtx()
	defer cancel()
	start := s.begin(kind)
	err := s.c.Remove(ctx, sb.id, true)
	s.op(kind, start, err)
	if err != nil {
		s.settle(sb, err)
		var ce *client.Error
		return errors.As(err, &ce) && ce.Status == 404
	}
	s.mu.Lock()
	delete(s.sbs, sb.id)
	s.mu.Unlock()
	session, id := sb.session, sb.id
	s.ack(kind, fmt.Sprintf("sandbox.removed of %s (%s) in session %s", sb.name, id, session), func(ev func(string) ([]client.Event, error)) error {
		evs, err := ev(session)
		if err != nil {
			return err
		}
		for _, x := range evs {
			if x.Type == "sandbox.removed" && x.SandboxID == id {
				return nil
			}
		}
		return fmt.Errorf("no sandbox.removed for %s", id)
	})
	return true
}

func (s *soak) doRemoveCheckpoint(rng *rand.Rand) bool {
	cks, err := s.ourCheckpoints()
	if err != nil || len(cks) == 0 {
		return false
	}
	ck := cks[rng.Intn(len(cks))]
	ctx, cancel := opCtx()
	defer cancel()
	start := s.begin("checkpoint-rm")
	s.op("checkpoint-rm", start, s.c.RemoveCheckpoint(ctx, ck.ID))
	return true
}

func (s *soak) doRemoveSnapshot(rng *rand.Rand) bool {
	ctx, cancel := opCtx()
	defer cancel()
	sns, err := s.c.Snapshots(ctx)
	if err != nil {
		return false
	}
	var ours []string
	for _, sn := range sns {
		if strings.HasPrefix(sn.Name, "soak-") {
			ours = append(ours, sn.ID)
		}
	}
	if len(ours) == 0 {
		return false
	}
	slices.Sort(ours)
	start := s.begin("snapshot-rm")
	s.op("snapshot-rm", start, s.c.RemoveSnapshot(ctx, ours[rng.Intn(len(ours))]))
	return true
}

// checkSettled: after the load, no sandbox of the soak stays in a
// transitional state, and none failed.
func (s *soak) checkSettled() {
	t := s.t
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ctx, cancel := opCtx()
		all, err := s.c.List(ctx)
		cancel()
		var stuck, failed []string
		for _, sb := range all {
			if !strings.HasPrefix(sb.Name, "soak-") {
				continue
			}
			switch sb.State {
			case "running", "stopped":
			case "failed":
				failed = append(failed, fmt.Sprintf("%s (%s, %s): %s", sb.Name, sb.ID, sb.Provider, sb.Error))
			default:
				stuck = append(stuck, fmt.Sprintf("%s (%s, %s) is %s", sb.Name, sb.ID, sb.Provider, sb.State))
			}
		}
		if err == nil && len(stuck) == 0 {
			for _, f := range failed {
				t.Errorf("soak: a sandbox failed during the soak (none was killed): %s", f)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("soak: sandboxes stuck 3 minutes after the load (list error: %v):\n  %s", err, strings.Join(stuck, "\n  "))
			return
		}
		time.Sleep(time.Second)
	}
}

// checkRunningAnswer: every sandbox the server lists as running answers an
// exec, and has the files acknowledged written into it.
func (s *soak) checkRunningAnswer() {
	t := s.t
	ctx, cancel := opCtx()
	all, err := s.c.List(ctx)
	cancel()
	if err != nil {
		t.Errorf("soak: list after the load: %v", err)
		return
	}
	n := 0
	for _, sb := range all {
		if sb.State != "running" {
			continue
		}
		n++
		var res *client.ExecResult
		var err error
		for try := 0; try < 3; try++ {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			res, err = s.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"ls", "-1", "/root"}})
			cancel()
			if err == nil {
				break
			}
			s.logf("exec in running %s (%s) failed (try %d): %v", sb.Name, sb.ID, try+1, err)
			time.Sleep(2 * time.Second)
		}
		if err != nil || res.ExitCode != 0 {
			t.Errorf("soak: %s (%s, %s) is listed as running but does not answer an exec: %v %+v", sb.Name, sb.ID, sb.Provider, err, res)
			continue
		}
		s.mu.Lock()
		known := s.sbs[sb.ID]
		var files []string
		if known != nil {
			files = slices.Clone(known.files)
		}
		s.mu.Unlock()
		have := strings.Fields(string(res.Stdout))
		for _, f := range files {
			if !slices.Contains(have, filepath.Base(f)) {
				t.Errorf("soak: %s (%s, %s) lost %s, written by an acknowledged exec (it has %v)", sb.Name, sb.ID, sb.Provider, f, have)
			}
		}
	}
	s.logf("%d running sandboxes answered an exec", n)
}

// removeAll removes every sandbox, checkpoint and snapshot of the soak
// through the API.
func (s *soak) removeAll() {
	t := s.t
	for try := 0; try < 5; try++ {
		ctx, cancel := opCtx()
		all, err := s.c.List(ctx)
		cancel()
		if err != nil {
			t.Errorf("soak: list: %v", err)
			return
		}
		left := 0
		for _, sb := range all {
			if !strings.HasPrefix(sb.Name, "soak-") {
				continue
			}
			left++
			s.mu.Lock()
			known := s.sbs[sb.ID]
			if known == nil {
				known = &soakSB{id: sb.ID, name: sb.Name, provider: sb.Provider, session: sb.Session}
			}
			s.mu.Unlock()
			s.remove("remove (final)", known)
		}
		if left == 0 {
			break
		}
		if try == 4 {
			t.Errorf("soak: sandboxes of the soak still listed after 5 rounds of removal")
		}
	}
	cks, err := s.ourCheckpoints()
	if err != nil {
		t.Errorf("soak: list checkpoints: %v", err)
	}
	for _, ck := range cks {
		ctx, cancel := opCtx()
		err := s.c.RemoveCheckpoint(ctx, ck.ID)
		cancel()
		s.op("checkpoint-rm (final)", time.Now(), err)
		if err != nil {
			t.Errorf("soak: remove checkpoint %s: %v", ck.ID, err)
		}
	}
	ctx, cancel := opCtx()
	defer cancel()
	sns, err := s.c.Snapshots(ctx)
	if err != nil {
		t.Errorf("soak: list snapshots: %v", err)
	}
	for _, sn := range sns {
		if strings.HasPrefix(sn.Name, "soak-") {
			err := s.c.RemoveSnapshot(ctx, sn.ID)
			s.op("snapshot-rm (final)", time.Now(), err)
			if err != nil {
				t.Errorf("soak: remove snapshot %s: %v", sn.Name, err)
			}
		}
	}
}

// checkLedger: every acknowledged operation is in the ledger.
func (s *soak) checkLedger() {
	cache := map[string][]client.Event{}
	ev := func(session string) ([]client.Event, error) {
		if evs, ok := cache[session]; ok {
			return evs, nil
		}
		var out []client.Event
		after := int64(0)
		for {
			ctx, cancel := opCtx()
			page, err := s.c.Events(ctx, session, after, 1000)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("events of session %s: %w", session, err)
			}
			out = append(out, page.Events...)
			if !page.More {
				break
			}
			after = page.Next
		}
		cache[session] = out
		return out, nil
	}
	var missing []string
	for _, a := range s.acks {
		if err := a.check(ev); err != nil {
			missing = append(missing, fmt.Sprintf("%s: %s: %v", a.kind, a.what, err))
		}
	}
	s.logf("ledger: %d acknowledged operations checked in %d sessions, %d missing", len(s.acks), len(cache), len(missing))
	if len(missing) > 0 {
		s.t.Errorf("soak: %d acknowledged operations are not in the ledger:\n  %s", len(missing), strings.Join(missing, "\n  "))
	}
}

// A soakArtifact is one thing on the host a sandbox, checkpoint or snapshot
// makes; owner says whose it is ("sb:ID", "ck:ID", "sn:ID", "ip:ADDR"; ""
// when it cannot be told).
type soakArtifact struct{ kind, desc, owner string }

// soakOwners is what may still hold artifacts once the soak removed its
// own: what the server lists (other tests' things) and environments' warm
// spares (no record: a paused runsc container).
type soakOwners struct {
	owned map[string]bool
	ours  map[string]bool // sandbox ids of the soak's sessions
}

// owners reads what the server lists now.
func (s *soak) owners() (*soakOwners, error) {
	ctx, cancel := opCtx()
	defer cancel()
	o := &soakOwners{owned: map[string]bool{}, ours: map[string]bool{}}
	all, err := s.c.List(ctx)
	if err != nil {
		return nil, err
	}
	addrs := soakAddresses(s.e)
	for _, sb := range all {
		o.owned["sb:"+sb.ID] = true
		if sb.IP != "" {
			o.owned["ip:"+sb.IP] = true
		}
		// A stopped sandbox keeps its address (and its policy's entries),
		// which the API does not show.
		if ip := addrs[sb.ID]; ip != "" {
			o.owned["ip:"+ip] = true
		}
	}
	cks, err := s.c.AllCheckpoints(ctx)
	if err != nil {
		return nil, err
	}
	for _, ck := range cks {
		o.owned["ck:"+ck.ID] = true
	}
	sns, err := s.c.Snapshots(ctx)
	if err != nil {
		return nil, err
	}
	for _, sn := range sns {
		o.owned["sn:"+sn.ID] = true
	}
	sessions, err := s.c.Sessions(ctx)
	if err != nil {
		return nil, err
	}
	for _, ss := range sessions {
		if !s.baseSessions[ss.Name] {
			o.ours[ss.SandboxID] = true
		}
	}
	if envs, err := s.c.Environments(ctx); err == nil && len(envs) > 0 {
		// Warm spares: paused runsc containers with no record, and their
		// port's address.
		for _, c := range soakContainers(s.e, "runsc") {
			if c.Status == "paused" && !o.owned["sb:"+c.ID] {
				o.owned["sb:"+c.ID] = true
			}
		}
		for _, a := range soakNft(s.e) {
			if a.kind == "nft-pair" {
				veth, ip, _ := strings.Cut(strings.TrimPrefix(a.owner, "pair:"), "=")
				if o.owned["sb:"+strings.TrimPrefix(veth, "vs")] {
					o.owned["ip:"+ip] = true
				}
			}
		}
	}
	return o, nil
}

// promised is what the sandbox store has promised (shard df), but its
// templates: an empty filesystem is kept per disk size once asked for.
func (s *soak) promised() (int64, error) {
	ctx, cancel := opCtx()
	defer cancel()
	du, err := s.c.DiskUsage(ctx)
	if err != nil {
		return 0, fmt.Errorf("disk usage: %w", err)
	}
	p := du.Store.PromisedBytes
	ents, _ := os.ReadDir(filepath.Join(s.e.dataDir, "storage", "templates"))
	for _, en := range ents {
		if info, err := en.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				p -= st.Blocks * 512
			}
		}
	}
	return p, nil
}

// soakAddresses reads every sandbox's address from the server's database
// (read-only): the API shows only a running sandbox's.
func soakAddresses(e *env) map[string]string {
	out := map[string]string{}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(e.dataDir, "shard.db")+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		return out
	}
	defer db.Close()
	rows, err := db.Query(`SELECT json_extract(doc, '$.id'), json_extract(doc, '$.ip') FROM sandboxes`)
	if err != nil {
		return out
	}
	defer rows.Close()
	for rows.Next() {
		var id, ip sql.NullString
		if rows.Scan(&id, &ip) == nil && id.Valid && ip.Valid {
			out[id.String] = ip.String
		}
	}
	return out
}

// checkConsistent: after the load, the host agrees with what the server
// lists. A stopped sandbox holds no container, process, mount, loop
// device, namespace, veth, port entry or cgroup (its files and its
// policy's entries stay); a running one has its container; every
// checkpoint and snapshot of the soak has its files.
func (s *soak) checkConsistent() {
	t := s.t
	o, err := s.owners()
	if err != nil {
		t.Errorf("soak: what the server lists: %v", err)
		return
	}
	ctx, cancel := opCtx()
	defer cancel()
	all, err := s.c.List(ctx)
	if err != nil {
		t.Errorf("soak: list: %v", err)
		return
	}
	held := map[string][]string{}
	for _, a := range s.artifacts(o) {
		if a.kind == "nft-pair" {
			veth, _, _ := strings.Cut(strings.TrimPrefix(a.owner, "pair:"), "=")
			a.kind, a.owner = "nftables", "sb:"+strings.TrimPrefix(veth, "vs")
		}
		if a.kind != "files" && strings.HasPrefix(a.owner, "sb:") {
			held[a.owner] = append(held[a.owner], a.desc)
		}
	}
	containers := map[string]bool{}
	for _, rt := range []string{"runsc", "runc"} {
		for _, c := range soakContainers(s.e, rt) {
			containers[rt+"/"+c.ID] = true
		}
	}
	for _, sb := range all {
		if !strings.HasPrefix(sb.Name, "soak-") {
			continue
		}
		rt := map[string]string{"gvisor": "runsc", "runc": "runc"}[sb.Provider]
		switch sb.State {
		case "stopped":
			if h := held["sb:"+sb.ID]; len(h) > 0 {
				t.Errorf("soak: %s (%s, %s) is stopped but holds:\n  %s", sb.Name, sb.ID, sb.Provider, strings.Join(h, "\n  "))
			}
		case "running":
			if !containers[rt+"/"+sb.ID] {
				t.Errorf("soak: %s (%s, %s) is listed as running but %s has no container %s", sb.Name, sb.ID, sb.Provider, rt, sb.ID)
			}
		}
	}
	cks, err := s.ourCheckpoints()
	if err != nil {
		t.Errorf("soak: list checkpoints: %v", err)
	}
	for _, ck := range cks {
		for _, p := range []string{filepath.Join(s.e.dataDir, "checkpoints", ck.ID), filepath.Join(s.e.dataDir, "storage", "saved", "ck-"+ck.ID+".img")} {
			if _, err := os.Stat(p); err != nil {
				t.Errorf("soak: checkpoint %s (of %s) is listed but lacks %s: %v", ck.ID, ck.SandboxName, p, err)
			}
		}
	}
	sns, err := s.c.Snapshots(ctx)
	if err != nil {
		t.Errorf("soak: list snapshots: %v", err)
	}
	for _, sn := range sns {
		p := filepath.Join(s.e.dataDir, "storage", "saved", "sn-"+sn.ID+".img")
		if _, err := os.Stat(p); err != nil && strings.HasPrefix(sn.Name, "soak-") {
			t.Errorf("soak: snapshot %s is listed but lacks %s: %v", sn.Name, p, err)
		}
	}
}

// artifacts lists everything of the server's on the host. o (nil at the
// baseline) names the soak's sandboxes, for what is shared with other
// servers on the machine (cgroups, processes in them).
func (s *soak) artifacts(o *soakOwners) []soakArtifact {
	var out []soakArtifact
	out = append(out, soakRuntimeContainers(s.e)...)
	out = append(out, soakProcesses(s.e, o)...)
	out = append(out, soakMounts(s.e)...)
	out = append(out, soakLoops(s.e)...)
	out = append(out, soakNetns(s.e)...)
	out = append(out, soakVeths(s.e)...)
	out = append(out, soakNft(s.e)...)
	out = append(out, soakCgroups(o)...)
	out = append(out, soakFiles(s.e)...)
	out = append(out, soakRAM(s.e)...)
	return out
}

// checkLeaks: once everything of the soak is removed, nothing of it is left
// on the host. Cleaning up may finish a moment after the answers (a
// checkpoint image's copy from RAM, say): looked at until it is clean, for
// up to a minute. It returns the number of leaks.
func (s *soak) checkLeaks() int {
	var leaks map[string][]string
	deadline := time.Now().Add(time.Minute)
	for {
		o, err := s.owners()
		if err != nil {
			s.t.Errorf("soak: what the server lists: %v", err)
			return -1
		}
		leaks = map[string][]string{}
		for _, a := range s.artifacts(o) {
			if s.baseline[a.desc] {
				continue
			}
			if a.kind == "nft-pair" {
				// A port's pair is whose its port is.
				veth, _, _ := strings.Cut(strings.TrimPrefix(a.owner, "pair:"), "=")
				a.kind, a.owner = "nftables", "sb:"+strings.TrimPrefix(veth, "vs")
			}
			if a.owner != "" && o.owned[a.owner] {
				continue
			}
			leaks[a.kind] = append(leaks[a.kind], a.desc+soakIf(a.owner != "", " ("+a.owner+soakIf(o.ours[strings.TrimPrefix(a.owner, "sb:")], ", a sandbox of the soak")+")"))
		}
		// The store's promises (disk bounds, saved copies, reservations
		// of forks and checkpoints) are back where they were.
		if p, err := s.promised(); err != nil {
			leaks["store promises"] = append(leaks["store promises"], err.Error())
		} else if p > s.basePromised {
			leaks["store promises"] = append(leaks["store promises"], fmt.Sprintf("%d bytes promised, %d before the soak (%+d)", p, s.basePromised, p-s.basePromised))
		}
		if len(leaks) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	n := 0
	kinds := slices.Sorted(func(yield func(string) bool) {
		for k := range leaks {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range kinds {
		n += len(leaks[k])
		s.t.Errorf("soak: leaked %s (%d):\n  %s", k, len(leaks[k]), strings.Join(leaks[k], "\n  "))
	}
	return n
}

func is12hex(s string) bool {
	if len(s) != 12 {
		return false
	}
	for _, r := range s {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}

// soakIDIn finds a sandbox id (12 hex digits) among the parts of a path or
// an argument.
func soakIDIn(s string) string {
	for _, p := range strings.FieldsFunc(s, func(r rune) bool { return r == '/' || r == '=' || r == '.' || r == ' ' }) {
		if is12hex(p) {
			return p
		}
	}
	return ""
}

type soakContainer struct{ ID, Status string }

func soakContainers(e *env, rt string) []soakContainer {
	out, err := exec.Command(rt, "--root", filepath.Join(e.runDir, rt), "list", "--format", "json").Output()
	if err != nil {
		return nil
	}
	var cs []soakContainer
	json.Unmarshal(out, &cs)
	return cs
}

// soakRuntimeContainers: containers under the server's runsc and runc roots.
func soakRuntimeContainers(e *env) []soakArtifact {
	var out []soakArtifact
	for _, rt := range []string{"runsc", "runc"} {
		for _, c := range soakContainers(e, rt) {
			out = append(out, soakArtifact{"containers", fmt.Sprintf("%s container %s", rt, c.ID), "sb:" + c.ID})
		}
	}
	return out
}

// soakProcesses: processes that run from the server's directories
// (runsc-sandbox, runsc-gofer, runsc and runc calls), and processes in the
// cgroups of the soak's sandboxes (runc init, the agent, what runs in it).
func soakProcesses(e *env, o *soakOwners) []soakArtifact {
	var out []soakArtifact
	ents, _ := os.ReadDir("/proc")
	server := 0
	if e.server != nil && e.server.Process != nil {
		server = e.server.Process.Pid
	}
	for _, en := range ents {
		pid, err := strconv.Atoi(en.Name())
		if err != nil || pid == server || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", en.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		cmd := strings.Join(args, " ")
		if len(cmd) > 160 {
			cmd = cmd[:160] + "..."
		}
		id, ours := "", false
		for _, a := range args {
			for _, dir := range []string{e.runDir, e.dataDir} {
				if strings.HasPrefix(a, dir+"/") || strings.Contains(a, "="+dir+"/") {
					ours = true
				}
			}
		}
		if ours {
			// runsc's last argument is the container id.
			if last := args[len(args)-1]; is12hex(last) {
				id = last
			} else {
				for _, a := range args {
					if id = soakIDIn(a); id != "" {
						break
					}
				}
			}
		} else if o != nil {
			cg, _ := os.ReadFile(filepath.Join("/proc", en.Name(), "cgroup"))
			for _, l := range strings.Split(string(cg), "\n") {
				if _, p, ok := strings.Cut(l, "/shard/"); ok {
					if c := strings.SplitN(p, "/", 2)[0]; o.ours[c] {
						id, ours = c, true
						break
					}
				}
			}
		}
		if !ours {
			continue
		}
		owner := ""
		if id != "" {
			owner = "sb:" + id
		}
		out = append(out, soakArtifact{"processes", fmt.Sprintf("process %d: %s", pid, cmd), owner})
	}
	return out
}

// soakMounts: mounts under the data and run directories, but the sandbox
// store itself.
func soakMounts(e *env) []soakArtifact {
	var out []soakArtifact
	for _, mp := range e.sandboxMounts() {
		for _, dir := range []string{e.dataDir, e.runDir} {
			if strings.HasPrefix(mp, dir+"/") {
				rel := strings.TrimPrefix(mp, dir+"/")
				out = append(out, soakArtifact{"mounts", "mount " + mp, soakOwnerOf(rel)})
			}
		}
	}
	return out
}

// soakOwnerOf tells whose a path under the data or run directory is.
func soakOwnerOf(rel string) string {
	parts := strings.Split(rel, "/")
	base := strings.TrimSuffix(parts[len(parts)-1], ".img")
	base = strings.TrimSuffix(base, ".pages")
	switch {
	case strings.HasPrefix(rel, "checkpoints/") && is12hex(parts[1]):
		return "ck:" + parts[1]
	case strings.HasPrefix(rel, "storage/saved/"):
		if k, ok := strings.CutPrefix(base, "ck-"); ok && is12hex(k) {
			return "ck:" + k
		}
		if k, ok := strings.CutPrefix(base, "sn-"); ok && is12hex(k) {
			return "sn:" + k
		}
		return ""
	}
	if id := soakIDIn(rel); id != "" {
		return "sb:" + id
	}
	return ""
}

// soakLoops: loop devices attached to files under the data directory, but
// the sandbox store's own image.
func soakLoops(e *env) []soakArtifact {
	var out []soakArtifact
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range devs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		f := strings.TrimSpace(string(b))
		if !strings.HasPrefix(f, e.dataDir+"/") || f == filepath.Join(e.dataDir, "storage.img") {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(p)))
		rel := strings.TrimSuffix(strings.TrimPrefix(f, e.dataDir+"/"), " (deleted)")
		out = append(out, soakArtifact{"loop devices", fmt.Sprintf("loop %s -> %s", dev, f), soakOwnerOf(rel)})
	}
	return out
}

// soakNetns: network namespaces the server bind-mounted.
func soakNetns(e *env) []soakArtifact {
	var out []soakArtifact
	ents, _ := os.ReadDir(filepath.Join(e.runDir, "netns"))
	for _, en := range ents {
		owner := ""
		if is12hex(en.Name()) {
			owner = "sb:" + en.Name()
		}
		out = append(out, soakArtifact{"netns", "netns " + filepath.Join(e.runDir, "netns", en.Name()), owner})
	}
	return out
}

// soakVeths: host ends of veths on the test's bridge.
func soakVeths(e *env) []soakArtifact {
	var out []soakArtifact
	b, _ := exec.Command("ip", "-o", "link", "show", "master", e.bridge).Output()
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		owner := ""
		if id := strings.TrimPrefix(name, "vs"); is12hex(id) {
			owner = "sb:" + id
		}
		out = append(out, soakArtifact{"veths", "veth " + name + " on " + e.bridge, owner})
	}
	return out
}

// soakNft: the per-sandbox entries of the server's nftables tables: policy
// chains and sets named after an address (p-, d-, a-, x-, r-A-B-C-D), the
// egress verdict map's elements, and the bridge table's ports and pairs.
func soakNft(e *env) []soakArtifact {
	var out []soakArtifact
	type obj struct {
		Family string          `json:"family"`
		Name   string          `json:"name"`
		Elem   json.RawMessage `json:"elem"`
	}
	list := func(family string) []map[string]obj {
		b, err := exec.Command("nft", "-j", "list", "table", family, e.bridge).Output()
		if err != nil {
			return nil
		}
		var doc struct {
			Nftables []map[string]obj `json:"nftables"`
		}
		json.Unmarshal(b, &doc)
		return doc.Nftables
	}
	addrOf := func(name string) string {
		if len(name) < 3 || name[1] != '-' || !strings.ContainsRune("pdaxr", rune(name[0])) {
			return ""
		}
		return strings.ReplaceAll(name[2:], "-", ".")
	}
	for _, item := range list("ip") {
		for kind, o := range item {
			switch kind {
			case "set", "chain":
				if a := addrOf(o.Name); a != "" {
					out = append(out, soakArtifact{"nftables", fmt.Sprintf("nft ip %s %s %s", e.bridge, kind, o.Name), "ip:" + a})
				}
			case "map":
				var elems []json.RawMessage
				json.Unmarshal(o.Elem, &elems)
				for _, el := range elems {
					var pair []json.RawMessage
					var key string
					if json.Unmarshal(el, &pair) == nil && len(pair) > 0 && json.Unmarshal(pair[0], &key) == nil {
						out = append(out, soakArtifact{"nftables", fmt.Sprintf("nft ip %s map %s element %s", e.bridge, o.Name, key), "ip:" + key})
					}
				}
			}
		}
	}
	for _, item := range list("bridge") {
		o, ok := item["set"]
		if !ok {
			continue
		}
		var elems []json.RawMessage
		json.Unmarshal(o.Elem, &elems)
		for _, el := range elems {
			var port string
			var cc struct {
				Concat []string `json:"concat"`
			}
			switch {
			case json.Unmarshal(el, &port) == nil:
				owner := ""
				if id := strings.TrimPrefix(port, "vs"); is12hex(id) {
					owner = "sb:" + id
				}
				out = append(out, soakArtifact{"nftables", fmt.Sprintf("nft bridge %s set %s element %s", e.bridge, o.Name, port), owner})
			case json.Unmarshal(el, &cc) == nil && len(cc.Concat) == 2:
				out = append(out, soakArtifact{"nft-pair", fmt.Sprintf("nft bridge %s set %s element %s . %s", e.bridge, o.Name, cc.Concat[0], cc.Concat[1]),
					"pair:" + cc.Concat[0] + "=" + cc.Concat[1]})
			}
		}
	}
	return out
}

// soakCgroups: cgroups of the soak's sandboxes (other servers on the
// machine use /shard/ too: only the soak's own ids are looked at).
func soakCgroups(o *soakOwners) []soakArtifact {
	if o == nil {
		return nil
	}
	var out []soakArtifact
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/shard/*")
	more, _ := filepath.Glob("/sys/fs/cgroup/shard/*")
	for _, d := range append(dirs, more...) {
		id := filepath.Base(d)
		if st, err := os.Stat(d); err != nil || !st.IsDir() || !o.ours[id] {
			continue
		}
		out = append(out, soakArtifact{"cgroups", "cgroup " + d, "sb:" + id})
	}
	return out
}

// soakFiles: what the data directory keeps per sandbox, checkpoint and
// snapshot.
func soakFiles(e *env) []soakArtifact {
	var out []soakArtifact
	for _, d := range []string{"run", "storage/sandboxes", "storage/mnt", "storage/saved", "checkpoints"} {
		ents, _ := os.ReadDir(filepath.Join(e.dataDir, d))
		for _, en := range ents {
			rel := d + "/" + en.Name()
			out = append(out, soakArtifact{"files", filepath.Join(e.dataDir, rel), soakOwnerOf(rel)})
		}
	}
	return out
}

// soakRAMDir is the server's --image-ram-dir auto: /dev/shm/shard-<hash of
// the data directory> (cmd/shard's imageRAMDir).
func soakRAMDir(e *env) string {
	abs, _ := filepath.Abs(e.dataDir)
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join("/dev/shm", "shard-"+hex.EncodeToString(sum[:4]))
}

// soakRAM: checkpoint images left in the RAM directory.
func soakRAM(e *env) []soakArtifact {
	var out []soakArtifact
	dir := soakRAMDir(e)
	ents, _ := os.ReadDir(dir)
	for _, en := range ents {
		owner := ""
		if id, ok := strings.CutSuffix(en.Name(), ".pages"); ok && is12hex(id) {
			owner = "ck:" + id
		}
		out = append(out, soakArtifact{"RAM images", filepath.Join(dir, en.Name()), owner})
	}
	return out
}

// checkServeLog: the server's log of the soak has no panic; its errors are
// shown, for the report.
func (s *soak) checkServeLog() {
	f, err := os.Open(s.e.serveLog)
	if err != nil {
		return
	}
	defer f.Close()
	f.Seek(s.logFrom, 0)
	b, _ := io.ReadAll(f)
	var errs []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "fatal error:") {
			s.t.Errorf("soak: the server panicked: %s (see %s)", l, s.e.serveLog)
		}
		if strings.Contains(l, "reconcile: sandbox is not running any more") && strings.Contains(l, "was=running") {
			// A kill -9 of the server leaves sandboxes running: one that
			// was running and is not after the restart died meanwhile.
			s.t.Errorf("soak: a running sandbox did not survive a kill of the server: %s", l)
		}
		if strings.Contains(l, "level=ERROR") {
			errs = append(errs, l)
		}
	}
	if len(errs) > 0 {
		show := errs
		if len(show) > 40 {
			show = show[:40]
		}
		s.logf("the server logged %d errors during the soak:\n  %s", len(errs), strings.Join(show, "\n  "))
	}
}

// figures logs what the soak did: operations by kind, kills, leaks, and
// the problems seen.
func (s *soak) figures(leaks int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kinds := make([]string, 0, len(s.ops))
	for k := range s.ops {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var b strings.Builder
	var tot soakOpStats
	fmt.Fprintf(&b, "%-28s %9s %6s %7s %9s %10s  %s\n", "OPERATION", "ATTEMPTED", "ACKED", "REFUSED", "IN-KILL", "UNEXPECTED", "REFUSALS")
	for _, k := range kinds {
		st := s.ops[k]
		var r []string
		for code, n := range st.refusals {
			r = append(r, fmt.Sprintf("%s:%d", code, n))
		}
		sort.Strings(r)
		fmt.Fprintf(&b, "%-28s %9d %6d %7d %9d %10d  %s\n", k, st.attempted, st.acked, st.refused, st.inWindow, st.unexpected, strings.Join(r, " "))
		tot.attempted += st.attempted
		tot.acked += st.acked
		tot.refused += st.refused
		tot.inWindow += st.inWindow
		tot.unexpected += st.unexpected
	}
	fmt.Fprintf(&b, "%-28s %9d %6d %7d %9d %10d\n", "TOTAL", tot.attempted, tot.acked, tot.refused, tot.inWindow, tot.unexpected)
	var rs []string
	for _, d := range s.restarts {
		rs = append(rs, d.Round(100*time.Millisecond).String())
	}
	var caught []string
	for k, v := range s.aimed {
		caught = append(caught, fmt.Sprintf("%s:%d", k, v))
	}
	sort.Strings(caught)
	s.t.Logf("soak figures (seed via SHARD_SOAK_SEED; %v of load):\n%skills: %d (restarts took %s; operations under way at the kills: %s)\nledger events checked: %d acknowledged operations\nleaks: %d\nunexpected: %d",
		s.deadline.Sub(s.start).Round(time.Second), b.String(), s.kills, strings.Join(rs, ", "), strings.Join(caught, " "), len(s.acks), leaks, len(s.problems))
	if len(s.problems) > 0 {
		s.t.Errorf("soak: %d unexpected errors (outside the kills' windows):\n  %s", len(s.problems), strings.Join(s.problems, "\n  "))
	}
}
