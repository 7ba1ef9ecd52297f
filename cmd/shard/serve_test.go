package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/metrics"
	"github.com/useshards/shard/internal/sandbox"
)

// --max-memory, --max-cpu and --max-pids take bounds up to what the host
// can honour, and name the flag when they refuse one.
func TestSandboxLimitsFlags(t *testing.T) {
	host := sandbox.HostLimits()
	tests := []struct {
		name             string
		memory, cpu      string
		pids             int64
		want             string // part of the error; "" for none
		wantMem, wantCPU int64
	}{
		{"host", "host", "host", sandbox.MaxPids, "", 0, 0},
		{"lower", "1GiB", "500m", 1000, "", 1 << 30, 500},
		{"memory past the host", "1PiB", "host", sandbox.MaxPids, "--max-memory", 0, 0},
		{"memory not a size", "lots", "host", sandbox.MaxPids, "--max-memory", 0, 0},
		{"cpu past the host", "host", "100000", sandbox.MaxPids, "--max-cpu", 0, 0},
		{"pids past the kernel's", "host", "host", 1000000000, "--max-pids", 0, 0},
		{"pids too few", "host", "host", 1, "--max-pids", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := sandboxLimits(&serveOptions{maxMemory: tt.memory, maxCPU: tt.cpu, maxPids: tt.pids})
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("sandboxLimits = %v, want an error naming %s", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if l.MemoryBytes != tt.wantMem || l.CPUMillis != tt.wantCPU || l.Pids != tt.pids {
				t.Errorf("sandboxLimits = %+v, want memory %d cpu %d pids %d", l, tt.wantMem, tt.wantCPU, tt.pids)
			}
			if got := host.Lower(l); got.MemoryBytes > host.MemoryBytes || got.CPUMillis > host.CPUMillis {
				t.Errorf("the limits %+v raise the host's %+v", got, host)
			}
		})
	}
}

// --ledger-min-free: auto is the default floor (0), 0 turns it off (< 0),
// a size is taken as given, however large.
func TestLedgerFloorFlag(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		err  bool
	}{
		{"auto", 0, false},
		{"0", -1, false},
		{"2GiB", 2 << 30, false},
		{"1PiB", 1 << 50, false},
		{"lots", 0, true},
		{"-1GiB", 0, true},
		{"", 0, true},
	}
	for _, tt := range tests {
		got, err := ledgerFloorFlag(tt.in)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("ledgerFloorFlag(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.err)
		}
		if err != nil && !strings.Contains(err.Error(), "--ledger-min-free") {
			t.Errorf("ledgerFloorFlag(%q) = %v: the error does not name the flag", tt.in, err)
		}
	}
}

// --metrics-listen on loopback answers a scraper's request (to an address
// or localhost), never one to a name, which only a web page rebinding its
// own name to 127.0.0.1 would send (DNS rebinding).
func TestMetricsOnlyRefusesRebinding(t *testing.T) {
	m := metrics.New("")
	for _, tt := range []struct {
		host     string
		loopback bool
		want     int
	}{
		{"127.0.0.1:9470", true, http.StatusOK},
		{"[::1]:9470", true, http.StatusOK},
		{"localhost:9470", true, http.StatusOK},
		{"LOCALHOST", true, http.StatusOK},
		{"attacker.example:9470", true, http.StatusMisdirectedRequest},
		{"localhost.attacker.example", true, http.StatusMisdirectedRequest},
		{"", true, http.StatusMisdirectedRequest},
		{"prom-target.lan:9470", false, http.StatusOK}, // not loopback: warned of, served to any name
	} {
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		r.Host = tt.host
		w := httptest.NewRecorder()
		metricsOnly(m, tt.loopback).ServeHTTP(w, r)
		if w.Code != tt.want {
			t.Errorf("Host %q (loopback %v): %d, want %d", tt.host, tt.loopback, w.Code, tt.want)
		}
	}
}
