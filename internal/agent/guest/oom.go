package guest

import (
	"bufio"
	"bytes"
	"context"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// oomGuard is an OOM killer inside the sandbox, for gVisor.
//
// gVisor has none of its own: when the sandbox's memory cgroup fills, the
// host kernel kills the Sentry and every process in the sandbox dies with it
// (gVisor issues #2520, #2533). So the host cgroup gets some headroom above
// the sandbox's bound, and this guard watches the sandbox's own view of its
// memory and kills the biggest process once use passes the bound, the way
// Linux's OOM killer would: only that process dies, the sandbox lives on.
//
// It costs nothing while the sandbox's memory holds still. Every look is
// several syscalls through the Sentry (reading /proc/meminfo also makes the
// Sentry count its committed pages), so the guard does not poll all the
// time: it watches (every 50 ms, every 5 ms past half the bound) from boot,
// and whenever the host pokes it (mem_check: the host's watch on the
// sandbox's memory cgroup saw it cross a threshold or come under reclaim),
// and goes idle once its memory has held still for watchQuiet.
type oomGuard struct {
	limit int64
	log   *slog.Logger
	wake  chan struct{} // a poke; buffered, one deep

	// The guard's view of the sandbox; tests replace them.
	readMem   func() (used, shmem int64) // MemTotal-MemAvailable, Shmem
	listPids  func() []int               // every process, the agent too
	procMem   func(pid int) int64        // private anonymous bytes (what its death frees), -1 when gone
	alive     func(pid int) bool         // still running (not gone, not a zombie)
	signal    func(pid int) error        // SIGKILL
	now       func() time.Time
	sleep     func(ctx context.Context, d time.Duration) bool // false when ctx ended
	starting  func(pid int) bool                              // a command the agent is starting, not yet exec'd
	self      int
	procExtra int64 // see procOverhead

	mu     sync.Mutex
	used   int64             // last charge seen; guarded by mu
	kills  int64             // guarded by mu
	victim map[int]time.Time // pids killed, and when; guarded by mu
	futile bool              // over the bound, nothing worth killing (logged); guarded by mu
}

const (
	watchSlow  = 50 * time.Millisecond // while under half the bound
	watchFast  = 5 * time.Millisecond  // past half the bound
	watchQuiet = time.Second           // a watch ends after this long without a move
	dyingFor   = 2 * time.Second       // a victim killed this recently is on its way out

	// procOverhead is what each process costs the host beyond what the
	// Sentry's /proc/meminfo counts: the Sentry's own structures for its
	// task and address space (Go heap, ~75-150 KiB) and, under systrap,
	// the host stub process that runs it (page tables and kernel stacks,
	// ~60-85 KiB). Measured on this host with 500-2700 guest processes
	// (sleeps and a shell fork bomb): 220-330 KiB of host memory each, of
	// which 90-95 KiB shows in meminfo. Without it a fork bomb under the
	// pids bound takes the host cgroup past its headroom (the Sentry is
	// killed) while meminfo still shows half the bound free. Like Linux,
	// where a process's kernel memory is charged to its memory cgroup, the
	// guard charges it to the sandbox's bound. Threads cost ~20 KiB each
	// and are not counted.
	procOverhead = 256 << 10
)

func newOOMGuard(limit int64, log *slog.Logger) *oomGuard {
	return &oomGuard{
		limit: limit, log: log, wake: make(chan struct{}, 1),
		readMem: readMeminfo, listPids: listPids, procMem: anonOf, alive: processAlive, starting: agentChild,
		signal: func(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) },
		now:    time.Now,
		sleep: func(ctx context.Context, d time.Duration) bool {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return false
			case <-t.C:
				return true
			}
		},
		self: os.Getpid(), procExtra: procOverhead,
		victim: map[int]time.Time{},
	}
}

// run watches from boot, then whenever poked, until ctx ends.
func (g *oomGuard) run(ctx context.Context) {
	for {
		g.watch(ctx)
		select {
		case <-ctx.Done():
			return
		case <-g.wake:
		}
	}
}

// poke asks the guard to watch (from now, for at least watchQuiet) and
// says how long the host may leave it alone.
func (g *oomGuard) poke() time.Duration {
	select {
	case g.wake <- struct{}{}:
	default: // a poke is already waiting
	}
	return watchQuiet
}

// step is how far the charge must move to count as a move.
func (g *oomGuard) step() int64 { return max(1<<20, g.limit/64) }

// watch samples the sandbox's memory until it has held still for
// watchQuiet, killing when it is past the bound.
func (g *oomGuard) watch(ctx context.Context) {
	ref, moved := int64(-1), g.now()
	for {
		select {
		case <-g.wake: // a poke while watching: the host saw a move
			moved = g.now()
		default:
		}
		charge, _, pids := g.charge()
		if ref < 0 || charge > ref+g.step() || charge < ref-g.step() {
			ref, moved = charge, g.now()
		}
		if charge > g.limit && g.relieve(ctx, charge, pids) {
			ref, moved = -1, g.now() // look again once the victims are gone
			continue
		}
		if g.now().Sub(moved) >= watchQuiet {
			return
		}
		interval := watchSlow
		if charge > g.limit/2 {
			interval = watchFast
		}
		if !g.sleep(ctx, interval) {
			return
		}
	}
}

// charge is what the sandbox holds against its bound: the memory the
// Sentry counts plus procOverhead for every process (but the agent and
// victims on their way out). It also returns the tmpfs part and the pids.
func (g *oomGuard) charge() (charge, shmem int64, pids []int) {
	used, shmem := g.readMem()
	pids = g.listPids()
	n := int64(0)
	now := g.now()
	g.mu.Lock()
	for _, pid := range pids {
		if pid != g.self && !g.dyingLocked(pid, now) {
			n++
		}
	}
	charge = used + n*g.procExtra
	g.used = charge
	if charge <= g.limit {
		g.futile = false
	}
	g.mu.Unlock()
	return charge, shmem, pids
}

// relieve kills what it takes to bring the charge back under the bound,
// biggest first, and waits for the victims to go. It reports whether it
// killed anything.
//
// It kills only processes whose death frees memory: what a process frees
// is its private memory (plus procOverhead), not its resident pages (the
// busybox binary it maps is most of a shell's 4 MiB). When files in a
// tmpfs (/dev/shm) fill the sandbox, every new command takes it a little
// past its bound, and killing it frees next to nothing: the next one is
// over again (every command was killed, rm too). So while the excess is
// small (within tmpfsGrace, which the host cgroup's headroom holds) and
// the tmpfs holds at least that much, only a process that frees a real
// share of the bound (limit/16) dies; and whenever killing every process
// would not bring the sandbox back under its bound, nothing does. Then it
// says so, once, and commands run on.
func (g *oomGuard) relieve(ctx context.Context, charge int64, pids []int) bool {
	var cands []procCharge
	now := g.now()
	g.mu.Lock()
	for _, pid := range pids {
		if pid == g.self || g.dyingLocked(pid, now) {
			continue
		}
		cands = append(cands, procCharge{pid: pid})
	}
	g.mu.Unlock()
	for i := range cands {
		if g.starting(cands[i].pid) {
			continue // the agent's own memory, for a moment
		}
		if anon := g.procMem(cands[i].pid); anon >= 0 {
			cands[i].bytes = anon + g.procExtra
		}
	}
	over := charge - g.limit
	_, shmem := g.readMem()
	if over <= g.tmpfsGrace() && shmem >= over {
		// Only a process that frees a real share of the bound.
		big := cands[:0:0]
		for _, c := range cands {
			if c.bytes >= max(over, g.limit/16) {
				big = append(big, c)
			}
		}
		cands = big
	}
	victims := pickVictims(cands, over, g.limit/16)
	var frees int64
	for _, v := range victims {
		frees += v.bytes
	}
	if frees < over {
		g.futileOnce(charge, shmem, frees)
		return false
	}
	killed := victims[:0]
	for _, v := range victims {
		if g.signal(v.pid) == nil {
			killed = append(killed, v)
		}
	}
	if len(killed) == 0 {
		return false
	}
	now = g.now()
	g.mu.Lock()
	g.kills += int64(len(killed))
	for _, v := range killed {
		g.victim[v.pid] = now
	}
	g.forgetLocked(now)
	g.mu.Unlock()
	g.log.Warn("out of memory: killed the biggest processes", "count", len(killed), "pid", killed[0].pid,
		"charge", killed[0].bytes, "over", charge-g.limit, "limit", g.limit)
	// Let the memory go before looking again (a victim's memory is freed
	// when it exits, before it is reaped).
	for i := 0; i < 100; i++ {
		gone := true
		for _, v := range killed {
			if g.alive(v.pid) {
				gone = false
				break
			}
		}
		if gone || !g.sleep(ctx, watchFast) {
			break
		}
	}
	return true
}

// tmpfsGrace is how far past its bound a sandbox whose tmpfs files hold the
// memory may go before small processes are killed after all.
func (g *oomGuard) tmpfsGrace() int64 { return min(16<<20, g.limit/8) }

// futileOnce says, once until the sandbox is back under its bound, that it
// is over but killing would not help.
func (g *oomGuard) futileOnce(charge, shmem, frees int64) {
	g.mu.Lock()
	first := !g.futile
	g.futile = true
	g.mu.Unlock()
	if first {
		g.log.Warn("out of memory, and killing would not help: every process together holds less than the excess (files in a tmpfs such as /dev/shm hold it)",
			"charge", charge, "limit", g.limit, "shmem", shmem, "processes_hold", frees)
	}
}

// procCharge is one process and what killing it would free.
type procCharge struct {
	pid   int
	bytes int64
}

// pickVictims chooses whom to kill to free over bytes: the biggest alone
// when it frees enough, as Linux would; else the biggest first until over
// plus slack is freed (many small ones, a fork bomb: the slack keeps the
// guard from killing one at a time while the bomb grows back).
func pickVictims(cands []procCharge, over, slack int64) []procCharge {
	c := append([]procCharge(nil), cands...)
	sort.SliceStable(c, func(i, j int) bool { return c[i].bytes > c[j].bytes })
	if len(c) == 0 {
		return nil
	}
	need := over
	if c[0].bytes < over {
		need = over + slack
	}
	var sum int64
	n := 0
	for n < len(c) && sum < need {
		sum += c[n].bytes
		n++
	}
	return c[:n]
}

// dyingLocked: pid was killed a moment ago. g.mu is held.
func (g *oomGuard) dyingLocked(pid int, now time.Time) bool {
	at, ok := g.victim[pid]
	return ok && now.Sub(at) < dyingFor
}

// forgetLocked drops victims killed long ago (their exit was reported, or
// they were not exec roots). g.mu is held.
func (g *oomGuard) forgetLocked(now time.Time) {
	if len(g.victim) < 1024 {
		return
	}
	for pid, at := range g.victim {
		if now.Sub(at) > time.Minute {
			delete(g.victim, pid)
		}
	}
}

// readMeminfo is MemTotal - MemAvailable and Shmem from the sandbox's
// /proc/meminfo, which gVisor computes from the Sentry's own accounting.
func readMeminfo() (used, shmem int64) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	var total, avail int64
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "MemTotal:":
			total = n * 1024
		case "MemAvailable:":
			avail = n * 1024
		case "Shmem:":
			shmem = n * 1024
		}
	}
	return total - avail, shmem
}

// listPids reads the process ids in /proc.
func listPids() []int {
	f, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	pids := make([]int, 0, len(names))
	for _, n := range names {
		if pid, err := strconv.Atoi(n); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// anonOf is a process's private anonymous memory: the sum of its smaps'
// Anonymous lines (gVisor counts a mapping's private pages there), what
// its death frees; -1 when it is gone.
func anonOf(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps")
	if err != nil {
		return -1
	}
	var kb int64
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("Anonymous:")); ok {
			f := strings.Fields(string(v))
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				kb += n
			}
		}
	}
	return kb << 10
}

// agentChild: pid is a command the agent is starting, between its fork and
// its exec. Go starts commands with vfork: the child shares the agent's
// memory until it execs, so its smaps are the agent's, the biggest in the
// sandbox: such a child was the guard's victim, and every command that
// started while the sandbox was past its bound died at once.
func agentChild(pid int) bool {
	self, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return false
	}
	exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	return err == nil && exe == self
}

// processAlive: the pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z' && b[i+2] != 'X'
	}
	return true
}

func (g *oomGuard) killed(pid int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, k := g.victim[pid]
	delete(g.victim, pid)
	return k
}

// stats is a fresh look: the charge, the bound and the kills so far.
func (g *oomGuard) stats() (used, limit, kills int64) {
	used, _, _ = g.charge()
	g.mu.Lock()
	defer g.mu.Unlock()
	return used, g.limit, g.kills
}
