package guest

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestOOMGuardKilledIsReportedOnce(t *testing.T) {
	g := newOOMGuard(1<<30, slog.New(slog.NewTextHandler(io.Discard, nil)))
	g.readMem = func() (int64, int64) { return 123, 0 }
	g.listPids = func() []int { return nil }
	g.mu.Lock()
	g.victim[42] = time.Now()
	g.kills = 1
	g.mu.Unlock()

	tests := []struct {
		pid  int
		want bool
	}{
		{41, false},
		{42, true},
		{42, false}, // consumed by the first question
	}
	for _, tt := range tests {
		if got := g.killed(tt.pid); got != tt.want {
			t.Errorf("killed(%d) = %v, want %v", tt.pid, got, tt.want)
		}
	}
	used, limit, kills := g.stats()
	if used != 123 || limit != 1<<30 || kills != 1 {
		t.Errorf("stats() = %d, %d, %d; want 123, %d, 1", used, limit, kills, 1<<30)
	}
}

func TestOOMGuardForgetsOldVictims(t *testing.T) {
	g := newOOMGuard(1, slog.New(slog.NewTextHandler(io.Discard, nil)))
	now := time.Now()
	for pid := 1; pid <= 2000; pid++ {
		g.victim[pid] = now.Add(-2 * time.Minute)
	}
	g.victim[5000] = now
	g.forgetLocked(now)
	if n := len(g.victim); n != 1 {
		t.Errorf("after forgetLocked with 2000 old victims and 1 new, %d remain; want 1", n)
	}
}

func TestReadMeminfoAndAnon(t *testing.T) {
	if anon := anonOf(os.Getpid()); anon <= 0 {
		t.Errorf("anonOf(self) = %d, want > 0", anon)
	}
	if anon := anonOf(-5); anon != -1 {
		t.Errorf("anonOf(-5) = %d, want -1", anon)
	}
	if used, shmem := readMeminfo(); used <= 0 || shmem < 0 {
		t.Errorf("readMeminfo() = %d, %d; want used > 0, shmem >= 0", used, shmem)
	}
	pids := listPids()
	found := false
	for _, p := range pids {
		found = found || p == os.Getpid()
	}
	if !found {
		t.Errorf("listPids() = %d pids without this process (%d)", len(pids), os.Getpid())
	}
	if !processAlive(os.Getpid()) || processAlive(-5) {
		t.Errorf("processAlive(self), processAlive(-5) = %v, %v; want true, false", processAlive(os.Getpid()), processAlive(-5))
	}
}

func TestPickVictims(t *testing.T) {
	const mib = 1 << 20
	pc := func(pid int, m int64) procCharge { return procCharge{pid: pid, bytes: m} }
	pids := func(v []procCharge) []int {
		var out []int
		for _, x := range v {
			out = append(out, x.pid)
		}
		return out
	}
	tests := []struct {
		name        string
		cands       []procCharge
		over, slack int64
		want        []int
	}{
		{"nothing to kill", nil, mib, 16 * mib, nil},
		{"the biggest alone frees enough: only it dies (as in Linux)",
			[]procCharge{pc(10, 2*mib), pc(11, 300*mib), pc(12, 40*mib)}, 5 * mib, 16 * mib, []int{11}},
		{"a hog smaller than the excess: it and the next, up to excess plus slack",
			[]procCharge{pc(10, 1*mib), pc(11, 10*mib), pc(12, 9*mib)}, 12 * mib, 4 * mib, []int{11, 12}},
		{"a fork bomb: many small ones, biggest first, excess plus slack",
			[]procCharge{pc(1, mib/2), pc(2, mib/2), pc(3, mib), pc(4, mib/2), pc(5, mib/2), pc(6, mib/2)},
			3 * mib / 2, mib / 2, []int{3, 1, 2}},
		{"not enough in all of them: all of them",
			[]procCharge{pc(10, mib/2), pc(11, mib)}, 500 * mib, 16 * mib, []int{11, 10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pids(pickVictims(tt.cands, tt.over, tt.slack))
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("pickVictims(%v, over %d) = %v, want %v", tt.cands, tt.over, got, tt.want)
			}
		})
	}
}

// fakeSandbox is the guard's view of a sandbox, with a clock that moves
// only when the guard sleeps.
type fakeSandbox struct {
	mu         sync.Mutex
	now        time.Time
	used       int64
	shmem      int64
	procs      map[int]int64 // pid -> rss
	looks      int           // readMem calls
	signals    []int
	freeOnKill bool
}

func newFakeGuard(limit int64, f *fakeSandbox, log io.Writer) *oomGuard {
	g := newOOMGuard(limit, slog.New(slog.NewTextHandler(log, nil)))
	g.self = 1
	g.readMem = func() (int64, int64) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.looks++
		return f.used, f.shmem
	}
	g.listPids = func() []int {
		f.mu.Lock()
		defer f.mu.Unlock()
		pids := []int{1}
		for p := range f.procs {
			pids = append(pids, p)
		}
		return pids
	}
	g.procMem = func(pid int) int64 {
		f.mu.Lock()
		defer f.mu.Unlock()
		if r, ok := f.procs[pid]; ok {
			return r
		}
		return -1
	}
	g.starting = func(pid int) bool { return pid == 99 }
	g.alive = func(pid int) bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		_, ok := f.procs[pid]
		return ok
	}
	g.signal = func(pid int) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.signals = append(f.signals, pid)
		if f.freeOnKill {
			f.used -= f.procs[pid]
		}
		delete(f.procs, pid)
		return nil
	}
	g.now = func() time.Time {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.now
	}
	g.sleep = func(ctx context.Context, d time.Duration) bool {
		f.mu.Lock()
		f.now = f.now.Add(d)
		f.mu.Unlock()
		return ctx.Err() == nil
	}
	return g
}

// A sandbox whose memory holds still: the guard looks for watchQuiet, then
// stops looking until it is poked (the old guard polled for ever: every
// 50 ms, every 5 ms past half the bound).
func TestOOMGuardGoesIdleWhenMemoryHoldsStill(t *testing.T) {
	for _, used := range []int64{10 << 20, 150 << 20} { // under, past half of 256 MiB
		f := &fakeSandbox{now: time.Unix(0, 0), used: used, procs: map[int]int64{7: used}}
		g := newFakeGuard(256<<20, f, io.Discard)
		g.watch(context.Background())
		elapsed := f.now.Sub(time.Unix(0, 0))
		if elapsed < watchQuiet || elapsed > watchQuiet+watchSlow {
			t.Errorf("used %d MiB: the watch ended after %v of sandbox time, want about %v", used>>20, elapsed, watchQuiet)
		}
		if len(f.signals) != 0 {
			t.Errorf("used %d MiB under a 256 MiB bound: killed %v", used>>20, f.signals)
		}
		// Idle: poked, it watches again; not poked, nothing looks.
		looks := f.looks
		if d := g.poke(); d < watchQuiet {
			t.Errorf("poke() = %v, want at least %v", d, watchQuiet)
		}
		select {
		case <-g.wake:
		default:
			t.Errorf("poke() left no wake-up for the idle guard")
		}
		if f.looks != looks {
			t.Errorf("the idle guard looked at memory %d times without being poked", f.looks-looks)
		}
	}
}

// Memory that keeps moving keeps the watch going; once it stops, the watch
// ends watchQuiet later.
func TestOOMGuardWatchesWhileMemoryMoves(t *testing.T) {
	f := &fakeSandbox{now: time.Unix(0, 0), used: 10 << 20, procs: map[int]int64{7: 10 << 20}}
	g := newFakeGuard(256<<20, f, io.Discard)
	grow := g.readMem
	g.readMem = func() (int64, int64) {
		f.mu.Lock()
		if f.now.Sub(time.Unix(0, 0)) < 3*time.Second {
			f.used += 2 << 20 // 2 MiB every look, for 3 s
		}
		f.mu.Unlock()
		return grow()
	}
	g.watch(context.Background())
	if got := f.now.Sub(time.Unix(0, 0)); got < 3*time.Second+watchQuiet-watchSlow {
		t.Errorf("memory grew for 3s, the watch ended after %v; want at least %v", got, 3*time.Second+watchQuiet)
	}
}

// Past the bound, the biggest process dies, and only it; the exec that
// started it is told (killed), and stats count it.
func TestOOMGuardKillsTheBiggest(t *testing.T) {
	const mib = 1 << 20
	f := &fakeSandbox{now: time.Unix(0, 0), used: 300 * mib, freeOnKill: true,
		procs: map[int]int64{7: 2 * mib, 8: 280 * mib, 9: 5 * mib}}
	g := newFakeGuard(256*mib, f, io.Discard)
	g.watch(context.Background())
	if !reflect.DeepEqual(f.signals, []int{8}) {
		t.Fatalf("killed %v, want [8] (the biggest, alone)", f.signals)
	}
	if k8, k7 := g.killed(8), g.killed(7); !k8 || k7 {
		t.Errorf("killed(8), killed(7) = %v, %v; want true, false", k8, k7)
	}
	if _, _, kills := g.stats(); kills != 1 {
		t.Errorf("stats() kills = %d, want 1", kills)
	}
}

// A command the agent is starting shares the agent's memory until it execs
// (vfork): it is no victim, however big that looks.
func TestOOMGuardSparesStartingCommands(t *testing.T) {
	const mib = 1 << 20
	f := &fakeSandbox{now: time.Unix(0, 0), used: 300 * mib, freeOnKill: true,
		procs: map[int]int64{99: 200 * mib, 8: 120 * mib}}
	g := newFakeGuard(256*mib, f, io.Discard)
	g.watch(context.Background())
	if !reflect.DeepEqual(f.signals, []int{8}) {
		t.Fatalf("killed %v, want [8] (not 99, a command being started)", f.signals)
	}
}

// A hog beside a full /dev/shm: killing it does bring the sandbox back
// under its bound, so it dies (the tmpfs rule spares only the futile).
func TestOOMGuardKillsAHogBesideTmpfs(t *testing.T) {
	const mib = 1 << 20
	f := &fakeSandbox{now: time.Unix(0, 0), used: 200 * mib, shmem: 60 * mib, freeOnKill: true,
		procs: map[int]int64{7: mib, 8: 130 * mib}}
	g := newFakeGuard(128*mib, f, io.Discard)
	g.watch(context.Background())
	if !reflect.DeepEqual(f.signals, []int{8}) {
		t.Fatalf("killed %v, want [8] (the hog)", f.signals)
	}
}

// Many small processes (a fork bomb under the pids bound): each costs the
// host procOverhead beyond what meminfo shows, so the guard counts it, and
// kills a batch of them at once.
func TestOOMGuardCountsProcessesAgainstTheBound(t *testing.T) {
	const mib = 1 << 20
	procs := map[int]int64{}
	for pid := 100; pid < 1200; pid++ { // 1100 processes of 100 KiB
		procs[pid] = 100 << 10
	}
	// meminfo shows 110 MiB: half the bound. With the overhead: 385 MiB.
	f := &fakeSandbox{now: time.Unix(0, 0), used: 110 * mib, procs: procs, freeOnKill: true}
	g := newFakeGuard(256*mib, f, io.Discard)
	g.watch(context.Background())
	if len(f.signals) == 0 {
		t.Fatalf("1100 processes charging %d MiB under a 256 MiB bound: none killed", (110*mib+1100*procOverhead)>>20)
	}
	charge, _, _ := g.charge()
	if charge > 256*mib {
		t.Errorf("after the kills the charge is %d MiB, want at most the bound (256 MiB)", charge>>20)
	}
	if len(f.signals) < 2 {
		t.Errorf("killed %d processes; want a batch", len(f.signals))
	}
}

// Memory held by files in a tmpfs, not by processes: killing would free
// nothing worth it, so nothing dies (every new command used to, rm too),
// it says so once, and the guard goes idle. Far past the bound, and a
// little past it.
func TestOOMGuardDoesNotKillForTmpfs(t *testing.T) {
	const mib = 1 << 20
	for _, used := range []int64{700 * mib, 258 * mib} {
		f := &fakeSandbox{now: time.Unix(0, 0), used: used, shmem: 200 * mib,
			procs: map[int]int64{7: mib / 2}}
		var log bytes.Buffer
		g := newFakeGuard(256*mib, f, &log)
		g.watch(context.Background())
		f.procs[8] = mib // an rm
		g.poke()
		<-g.wake
		g.watch(context.Background())
		if len(f.signals) != 0 {
			t.Errorf("used %d MiB: killed %v while tmpfs holds the memory; want none", used>>20, f.signals)
		}
		if n := strings.Count(log.String(), "killing would not help"); n != 1 {
			t.Errorf("used %d MiB: said %d times that no process is worth killing, want once:\n%s", used>>20, n, log.String())
		}
	}
}
