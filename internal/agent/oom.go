package agent

import (
	"bufio"
	"bytes"
	"context"
	"log/slog"
	"os"
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
type oomGuard struct {
	limit int64
	log   *slog.Logger

	mu     sync.Mutex
	used   int64        // guarded by mu
	kills  int64        // guarded by mu
	victim map[int]bool // pids the guard killed; guarded by mu
}

func newOOMGuard(limit int64, log *slog.Logger) *oomGuard {
	return &oomGuard{limit: limit, log: log, victim: map[int]bool{}}
}

func (g *oomGuard) run(ctx context.Context) {
	// Poll slowly while far from the bound, fast when close to it: an idle
	// sandbox should cost next to nothing.
	interval := 50 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
		used := memUsed()
		interval = 50 * time.Millisecond
		if used > g.limit/2 {
			interval = 5 * time.Millisecond
		}
		g.mu.Lock()
		g.used = used
		g.mu.Unlock()
		if used > g.limit {
			g.killBiggest()
		}
	}
}

// memUsed is MemTotal - MemAvailable from the sandbox's /proc/meminfo,
// which gVisor computes from the Sentry's own accounting.
func memUsed() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
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
		}
	}
	return total - avail
}

func (g *oomGuard) killBiggest() {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	self := os.Getpid()
	best, bestRSS := 0, int64(-1)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if rss := rssOf(pid); rss > bestRSS {
			best, bestRSS = pid, rss
		}
	}
	if best == 0 {
		return
	}
	if syscall.Kill(best, syscall.SIGKILL) == nil {
		g.mu.Lock()
		g.kills++
		g.victim[best] = true
		g.mu.Unlock()
		g.log.Warn("out of memory: killed the biggest process", "pid", best, "rss", bestRSS, "limit", g.limit)
		time.Sleep(20 * time.Millisecond) // let the memory go before looking again
	}
}

func rssOf(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return -1
	}
	n, _ := strconv.ParseInt(f[1], 10, 64)
	return n * int64(os.Getpagesize())
}

func (g *oomGuard) killed(pid int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.victim[pid]
	delete(g.victim, pid)
	if len(g.victim) > 1024 { // victims nobody asked about (not exec roots)
		clear(g.victim)
	}
	return k
}

func (g *oomGuard) stats() (used, limit, kills int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used, g.limit, g.kills
}
