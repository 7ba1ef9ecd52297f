package sandbox

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/useshards/shard/internal/agent/proto"
)

// The agent's request carries every field of the service's, renamed where
// the agent names it otherwise, and a timeout in whole milliseconds, never
// rounded down to none.
func TestAgentRequest(t *testing.T) {
	tests := []struct {
		name string
		req  ExecRequest
		want proto.Request
	}{
		{"argv only", ExecRequest{Argv: []string{"true"}}, proto.Request{Op: proto.OpExec, Argv: []string{"true"}}},
		{"every field",
			ExecRequest{Argv: []string{"sh", "-c", "x"}, Env: []string{"A=1"}, Workdir: "/tmp", User: "1000:1000",
				TTY: true, Rows: 40, Cols: 120, Stdin: true, Timeout: 30 * time.Second},
			proto.Request{Op: proto.OpExec, Argv: []string{"sh", "-c", "x"}, Env: []string{"A=1"}, Dir: "/tmp", User: "1000:1000",
				TTY: true, Rows: 40, Cols: 120, Stdin: true, TimeoutMS: 30_000}},
		{"a timeout in whole milliseconds", ExecRequest{Argv: []string{"true"}, Timeout: 1500 * time.Millisecond},
			proto.Request{Op: proto.OpExec, Argv: []string{"true"}, TimeoutMS: 1500}},
		{"a timeout finer than a millisecond, rounded up", ExecRequest{Argv: []string{"true"}, Timeout: time.Microsecond},
			proto.Request{Op: proto.OpExec, Argv: []string{"true"}, TimeoutMS: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := agentRequest(tt.req); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("agentRequest(%+v) = %+v, want %+v", tt.req, got, tt.want)
			}
		})
	}
	// Every field of ExecRequest reaches the agent: a field added to one
	// and not the other fails here.
	if n, m := reflect.TypeFor[ExecRequest]().NumField(), 9; n != m {
		t.Errorf("ExecRequest has %d fields, agentRequest translates %d: translate the new one", n, m)
	}
}

// The agent's exec frames become the service's: output as it is, the exit
// with every field, anything else dropped.
func TestExecFrame(t *testing.T) {
	full := proto.Exit{Code: 137, Signal: 9, TimedOut: true, OOM: true, Error: "why",
		StdinBytes: 1, StdoutBytes: 2, StderrBytes: 3, OutputCut: true}
	exit, _ := json.Marshal(full)
	tests := []struct {
		name   string
		typ    byte
		p      []byte
		want   ExecFrame
		wantOK bool
	}{
		{"stdout", proto.FrameStdout, []byte("out"), ExecFrame{Kind: ExecStdout, Data: []byte("out")}, true},
		{"stderr", proto.FrameStderr, []byte("err"), ExecFrame{Kind: ExecStderr, Data: []byte("err")}, true},
		{"exit", proto.FrameExit, exit, ExecFrame{Kind: ExecExited, Exit: ExecExit{Code: 137, Signal: 9, TimedOut: true, OOM: true,
			Error: "why", StdinBytes: 1, StdoutBytes: 2, StderrBytes: 3, OutputCut: true}}, true},
		{"an exit from an older agent", proto.FrameExit, []byte(`{"exit_code":3}`), ExecFrame{Kind: ExecExited, Exit: ExecExit{Code: 3}}, true},
		{"a broken exit", proto.FrameExit, []byte(`nonsense`), ExecFrame{Kind: ExecExited}, true},
		{"credit", proto.FrameCredit, []byte(`{"bytes":1}`), ExecFrame{}, false},
		{"an unknown frame", 'Z', []byte("x"), ExecFrame{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := execFrame(tt.typ, tt.p)
			if ok != tt.wantOK || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("execFrame(%q, %q) = %+v, %v; want %+v, %v", tt.typ, tt.p, got, ok, tt.want, tt.wantOK)
			}
		})
	}
	// Every field of the agent's exit reaches the service's.
	if n, m := reflect.TypeFor[proto.Exit]().NumField(), reflect.TypeFor[ExecExit]().NumField(); n != m {
		t.Errorf("proto.Exit has %d fields, ExecExit %d: translate the new one", n, m)
	}
}
