package sandbox

import (
	"math"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/store"
)

func testService() *Service {
	return link(&Service{
		cfg:  Config{DefaultProvider: "runc"},
		caps: map[string]provider.Capabilities{"runc": {Name: "runc", Available: true}},
	})
}

// validate refuses every bound the host cannot honour, with a 400 that
// gives the range, and never changes one it was given.
func TestValidateBounds(t *testing.T) {
	host := HostLimits()
	tests := []struct {
		name string
		req  CreateRequest
		want string // part of the message; "" for success
	}{
		{"defaults", CreateRequest{Image: "busybox"}, ""},
		{"all given", CreateRequest{Image: "busybox", Bounds: store.Bounds{MemoryBytes: 64 << 20, CPUMillis: 500, DiskBytes: 1 << 30, Pids: 100}}, ""},
		{"least", CreateRequest{Image: "busybox", Bounds: store.Bounds{MemoryBytes: MinMemory, CPUMillis: MinCPU, DiskBytes: MinDisk, Pids: MinPids}}, ""},
		{"most", CreateRequest{Image: "busybox", Bounds: store.Bounds{MemoryBytes: host.MemoryBytes, CPUMillis: host.CPUMillis, DiskBytes: MaxDisk, Pids: MaxPids}}, ""},
		// Old code: accepted, and the host got 2n+512 wrapped (510).
		{"pids max int64", CreateRequest{Image: "busybox", Bounds: store.Bounds{Pids: math.MaxInt64}}, "from 8 to 4194304"},
		// Old code: accepted, and runc failed (a 500).
		{"pids 2^31", CreateRequest{Image: "busybox", Bounds: store.Bounds{Pids: 1 << 31}}, "from 8 to 4194304"},
		{"pids past pid_max", CreateRequest{Image: "busybox", Bounds: store.Bounds{Pids: MaxPids + 1}}, "from 8 to 4194304"},
		{"pids too few", CreateRequest{Image: "busybox", Bounds: store.Bounds{Pids: 7}}, "from 8"},
		{"pids negative", CreateRequest{Image: "busybox", Bounds: store.Bounds{Pids: -1}}, "from 8"},
		{"memory past the host", CreateRequest{Image: "busybox", Bounds: store.Bounds{MemoryBytes: host.MemoryBytes + 1<<20}}, "more than this host can give"},
		{"memory max int64", CreateRequest{Image: "busybox", Bounds: store.Bounds{MemoryBytes: math.MaxInt64}}, "at most"},
		{"memory negative", CreateRequest{Image: "busybox", Bounds: store.Bounds{MemoryBytes: -1}}, "too small"},
		{"memory too small", CreateRequest{Image: "busybox", Bounds: store.Bounds{MemoryBytes: 1 << 20}}, "at least 32MiB"},
		{"cpu past the host", CreateRequest{Image: "busybox", Bounds: store.Bounds{CPUMillis: host.CPUMillis + 1}}, "more than this host has"},
		{"cpu too little", CreateRequest{Image: "busybox", Bounds: store.Bounds{CPUMillis: 9}}, "at least 0.01"},
		{"disk too large", CreateRequest{Image: "busybox", Bounds: store.Bounds{DiskBytes: MaxDisk + 1}}, "at most 1PiB"},
		{"disk max int64", CreateRequest{Image: "busybox", Bounds: store.Bounds{DiskBytes: math.MaxInt64}}, "too large"},
		{"disk too small", CreateRequest{Image: "busybox", Bounds: store.Bounds{DiskBytes: 1 << 20}}, "at least 16MiB"},
		{"env with NUL", CreateRequest{Image: "busybox", Env: []string{"A=b\x00c"}}, "NUL"},
		{"env not K=V", CreateRequest{Image: "busybox", Env: []string{"A"}}, "not KEY=VALUE"},
		{"env bad name", CreateRequest{Image: "busybox", Env: []string{"A-B=1"}}, "not KEY=VALUE"},
		{"bad name", CreateRequest{Image: "busybox", Name: "../x"}, "not valid"},
		{"id-like name", CreateRequest{Image: "busybox", Name: "0123456789ab"}, "looks like an id"},
		{"no image", CreateRequest{}, "image is required"},
		{"unknown provider", CreateRequest{Image: "busybox", Provider: "qemu"}, "unknown provider"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.req
			err := testService().validate(&req)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("validate(%+v) = %v, want nil", tt.req, err)
				}
				for _, b := range []struct {
					name      string
					got, gave int64
				}{{"memory", req.MemoryBytes, tt.req.MemoryBytes}, {"cpu", req.CPUMillis, tt.req.CPUMillis},
					{"disk", req.DiskBytes, tt.req.DiskBytes}, {"pids", req.Pids, tt.req.Pids}} {
					if b.gave != 0 && b.got != b.gave {
						t.Errorf("validate changed %s from %d to %d", b.name, b.gave, b.got)
					}
				}
				return
			}
			if err == nil || errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("validate(%+v) = %v (kind %s), want invalid_argument saying %q", tt.req, err, errdefs.KindOf(err), tt.want)
			}
		})
	}
}

// CheckCreate judges a copy: a create from a snapshot whose disk is left
// out must reach Create with the disk still zero.
func TestCheckCreateLeavesRequest(t *testing.T) {
	req := CreateRequest{FromSnapshot: "snap"}
	if err := CheckCreate(req, Limits{MemoryBytes: 1 << 30, CPUMillis: 2000}); err != nil {
		t.Fatal(err)
	}
	if req.DiskBytes != 0 || req.MemoryBytes != 0 {
		t.Fatalf("CheckCreate filled in the caller's request: %+v", req)
	}
	err := CheckCreate(CreateRequest{Bounds: store.Bounds{MemoryBytes: 2 << 30}}, Limits{MemoryBytes: 1 << 30, MemoryFrom: "test", CPUMillis: 2000})
	if err == nil || !strings.Contains(err.Error(), "at most 1GiB (test)") {
		t.Fatalf("CheckCreate(2GiB on a 1GiB host) = %v", err)
	}
	err = CheckCreate(CreateRequest{Bounds: store.Bounds{CPUMillis: 2001}}, Limits{MemoryBytes: 1 << 30, CPUMillis: 2000})
	if err == nil || !strings.Contains(err.Error(), "at most 2 (its cpus)") {
		t.Fatalf("CheckCreate(2.001 cpus on 2) = %v", err)
	}
}

func TestMemTotal(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"MemTotal:       24570000 kB\nMemFree: 1 kB\n", 24570000 << 10, true},
		{"MemFree: 1 kB\nMemTotal: 1024 kB\n", 1 << 20, true},
		{"MemFree: 1 kB\n", 0, false},
		{"MemTotal: lots kB\n", 0, false},
		{"MemTotal: 0 kB\n", 0, false},
		{"MemTotal: 99999999999999999999 kB\n", 0, false},
	} {
		got, ok := memTotal([]byte(tt.in))
		if got != tt.want || ok != tt.ok {
			t.Errorf("memTotal(%q) = %d, %v; want %d, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
	if l := HostLimits(); l.MemoryBytes <= 0 || l.CPUMillis < 1000 {
		t.Fatalf("HostLimits() = %+v", l)
	}
}

// A checkpoint's tag is refused before the sandbox is even looked up
// (the test service has no store: a lookup would panic).
func TestCheckpointTag(t *testing.T) {
	for _, tag := range []string{"a/b", "../x", "t\x00", strings.Repeat("t", 129), strings.Repeat("t", 300), ".x", "a b"} {
		_, err := testService().Saved().Checkpoint(own(), "base", tag)
		if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), "at most 128") {
			t.Errorf("Checkpoint(tag %q) = %v, want invalid_argument stating the rule", tag, err)
		}
	}
}

// A server's --max-memory, --max-cpu and --max-pids bound creates below
// the host's, each refusal naming the flag; defaults past them are
// lowered to them; restores of a checkpoint taken when the server allowed
// more are refused the same way.
func TestServerLimits(t *testing.T) {
	lowered := Limits{MemoryBytes: 256 << 20, MemoryFrom: "shard serve --max-memory",
		CPUMillis: 500, CPUFrom: "shard serve --max-cpu", Pids: 100, PidsFrom: "shard serve --max-pids"}
	s := testService()
	s.cfg.Limits = lowered
	tests := []struct {
		name string
		req  CreateRequest
		want string
	}{
		{"memory past --max-memory", CreateRequest{Image: "busybox", Bounds: store.Bounds{MemoryBytes: 512 << 20}}, "--max-memory"},
		{"cpu past --max-cpu", CreateRequest{Image: "busybox", Bounds: store.Bounds{CPUMillis: 1000}}, "--max-cpu"},
		{"pids past --max-pids", CreateRequest{Image: "busybox", Bounds: store.Bounds{Pids: 101}}, "from 8 to 100 (shard serve --max-pids)"},
		{"at the bounds", CreateRequest{Image: "busybox", Bounds: store.Bounds{MemoryBytes: 256 << 20, CPUMillis: 500, Pids: 100}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.req
			err := s.validate(&req)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("validate = %v, want nil", err)
				}
				return
			}
			if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("validate = %v, want a 400 naming %q", err, tt.want)
			}
		})
	}
	t.Run("defaults lowered", func(t *testing.T) {
		req := CreateRequest{Image: "busybox", Bounds: store.Bounds{Pids: 50}}
		if err := s.validate(&req); err != nil {
			t.Fatalf("validate of a create with default memory and cpu = %v, want them lowered to the bounds", err)
		}
		if req.MemoryBytes != 256<<20 || req.CPUMillis != 500 {
			t.Errorf("defaults = memory %d cpu %d, want 256MiB and 500m", req.MemoryBytes, req.CPUMillis)
		}
	})
	t.Run("a higher bound does not raise the host's", func(t *testing.T) {
		host := HostLimits()
		if got := host.Lower(Limits{MemoryBytes: host.MemoryBytes * 2, CPUMillis: host.CPUMillis * 2, Pids: MaxPids * 2}); got != host {
			t.Errorf("Lower(twice the host) = %+v, want the host's %+v", got, host)
		}
	})
	t.Run("restore of a checkpoint past the bounds", func(t *testing.T) {
		s.caps["gvisor"] = provider.Capabilities{Name: "gvisor", Available: true, Checkpoint: true}
		for _, ck := range []*store.Checkpoint{
			{ID: "ck-mem", Shape: store.Shape{Provider: "gvisor", Bounds: store.Bounds{MemoryBytes: 1 << 30, CPUMillis: 100, Pids: 10}}},
			{ID: "ck-cpu", Shape: store.Shape{Provider: "gvisor", Bounds: store.Bounds{MemoryBytes: 64 << 20, CPUMillis: 2000, Pids: 10}}},
			{ID: "ck-pids", Shape: store.Shape{Provider: "gvisor", Bounds: store.Bounds{MemoryBytes: 64 << 20, CPUMillis: 100, Pids: 4096}}},
		} {
			_, err := s.saved.restore(own(), ck, RestoreOptions{})
			if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), "checkpoint "+ck.ID) || !strings.Contains(err.Error(), "shard serve --max-") {
				t.Errorf("restore of %s = %v, want a 400 naming it and the bound", ck.ID, err)
			}
		}
	})
}
