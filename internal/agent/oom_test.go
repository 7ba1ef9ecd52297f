package agent

import (
	"io"
	"log/slog"
	"os"
	"testing"
)

func TestOOMGuardKilledIsReportedOnce(t *testing.T) {
	g := newOOMGuard(1<<30, slog.New(slog.NewTextHandler(io.Discard, nil)))
	g.mu.Lock()
	g.victim[42] = true
	g.kills = 1
	g.used = 123
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

func TestOOMGuardForgetsUnclaimedVictims(t *testing.T) {
	g := newOOMGuard(1, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for pid := 1; pid <= 2000; pid++ {
		g.victim[pid] = true
	}
	g.killed(1)
	if n := len(g.victim); n != 0 {
		t.Errorf("after killed() with 1999 unclaimed victims, %d remain; want 0", n)
	}
}

func TestRSSAndMemUsed(t *testing.T) {
	if rss := rssOf(os.Getpid()); rss <= 0 {
		t.Errorf("rssOf(self) = %d, want > 0", rss)
	}
	if rss := rssOf(-5); rss != -1 {
		t.Errorf("rssOf(-5) = %d, want -1", rss)
	}
	if used := memUsed(); used <= 0 {
		t.Errorf("memUsed() = %d, want > 0", used)
	}
}
