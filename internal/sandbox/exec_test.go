package sandbox

import (
	"strings"
	"testing"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/store"
)

// An exec refused for its size is a 400 and leaves nothing in the ledger:
// exec_started was written before the argv was judged (40 requests with a
// 1MiB argv added 40MiB, each a 400).
func TestExecRefusedBeforeLedger(t *testing.T) {
	s, _ := grantTestService(t)
	ctx := own()
	// Nothing listens for this sandbox's agent: a command let through
	// would be recorded, then fail to connect.
	sb := &store.Sandbox{ID: "big-id", Name: "big", State: StateRunning, IP: "127.0.0.1", Token: "t", Session: "big"}
	if err := s.cfg.Store.CreateSandbox(ctx, sb, &store.EventSpec{Type: "test"}); err != nil {
		t.Fatal(err)
	}
	many := func(n int, s string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	tests := []struct {
		name string
		req  ExecRequest
		want string
	}{
		{"1MiB argument", ExecRequest{Argv: []string{"echo", strings.Repeat("a", 1<<20)}}, "at most 131072"},
		{"arguments summing past the bound", ExecRequest{Argv: many(MaxArgs, strings.Repeat("a", 64))}, "at most 131072"},
		{"too many arguments", ExecRequest{Argv: many(MaxArgs+1, "a")}, "at most 4096"},
		{"too many variables", ExecRequest{Argv: []string{"true"}, Env: many(MaxEnvVars+1, "A=1")}, "at most 1024"},
		{"variables too large", ExecRequest{Argv: []string{"true"}, Env: []string{"A=" + strings.Repeat("v", MaxEnvBytes)}}, "at most 131072"},
		{"no command", ExecRequest{}, "no command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := s.Exec(ctx, "big", tt.req)
			if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Exec = %v, want a 400 saying %q", err, tt.want)
			}
			evs, err := s.cfg.Store.Events(ctx, "big", 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != 1 {
				t.Fatalf("the session has %d events after a refused exec, want 1 (its create): %v", len(evs), evs[len(evs)-1].Type)
			}
		})
	}
}

// The bounds take what fits them exactly.
func TestCheckArgvEnvEdges(t *testing.T) {
	argv := []string{strings.Repeat("a", MaxArgvBytes)}
	if err := CheckArgv("command", argv); err != nil {
		t.Errorf("CheckArgv of exactly %d bytes: %v", MaxArgvBytes, err)
	}
	env := []string{"A=" + strings.Repeat("v", MaxEnvBytes-2)}
	if err := CheckEnv(env); err != nil {
		t.Errorf("CheckEnv of exactly %d bytes: %v", MaxEnvBytes, err)
	}
	if err := CheckEnv([]string{"A=\x00"}); err == nil {
		t.Error("CheckEnv took a NUL byte in a value")
	}
}
