package ledger

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/internal/store"
)

// ev builds a ledger event; data is marshalled to JSON unless it is a
// string, which is used as the raw Data as it is (for malformed data).
func ev(t *testing.T, seq int64, typ string, data any) store.Event {
	t.Helper()
	e := store.Event{Seq: seq, Session: "s", Type: typ, SandboxID: "sb1", At: time.Unix(seq, 0).UTC()}
	switch d := data.(type) {
	case nil:
	case string:
		e.Data = json.RawMessage(d)
	default:
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatalf("marshal %T: %v", data, err)
		}
		e.Data = b
	}
	return e
}

func intp(n int) *int { return &n }

func created(ck string) CreatedData {
	return CreatedData{Image: "alpine:3", Digest: "sha256:abc", Provider: "gvisor", Checkpoint: ck, Bounds: store.Bounds{MemoryBytes: 256 << 20}}
}

func started(id string, argv ...string) ExecStartedData {
	return ExecStartedData{Exec: id, Argv: argv, Cwd: "/work", EnvNames: []string{"HOME"}}
}

func checkpoint(id string) CheckpointData {
	return CheckpointData{Checkpoint: id, Kind: "checkpoint", FreezeMS: 12}
}

// existing returns an exists func that knows ids.
func existing(ids ...string) func(string) bool {
	return func(id string) bool {
		for _, x := range ids {
			if x == id {
				return true
			}
		}
		return false
	}
}

func TestPlanResume(t *testing.T) {
	lost := &ExecFinishedData{Exec: "x1", DurationMS: 5, Error: LostError}
	failed := &ExecFinishedData{Exec: "x1", Error: "exec: \"nope\": executable file not found in $PATH"}
	nonzero := &ExecFinishedData{Exec: "x1", ExitCode: intp(3), DurationMS: 40}
	zero := &ExecFinishedData{Exec: "x2", ExitCode: intp(0), DurationMS: 7}

	tests := []struct {
		name   string
		events func(t *testing.T) []store.Event
		exists func(string) bool
		want   Plan
		// wantEnded is Ended() of each planned exec, in order.
		wantEnded []bool
	}{
		{
			name: "created only",
			events: func(t *testing.T) []store.Event {
				return []store.Event{ev(t, 1, Created, created(""))}
			},
			exists: existing(),
			want:   Plan{Created: created("")},
		},
		{
			name: "created without data",
			events: func(t *testing.T) []store.Event {
				return []store.Event{ev(t, 1, Created, nil)}
			},
			exists: existing(),
			want:   Plan{},
		},
		{
			name: "created from a checkpoint that exists",
			events: func(t *testing.T) []store.Event {
				return []store.Event{
					ev(t, 4, Created, created("ck0")),
					ev(t, 5, ExecStarted, started("x1", "make")),
				}
			},
			exists: existing("ck0"),
			want: Plan{
				Created:    created("ck0"),
				Checkpoint: "ck0",
				Execs:      []PlannedExec{{Seq: 5, Started: started("x1", "make")}},
			},
			wantEnded: []bool{false},
		},
		{
			name: "created from a checkpoint that is gone",
			events: func(t *testing.T) []store.Event {
				return []store.Event{
					ev(t, 4, Created, created("ck0")),
					ev(t, 5, ExecStarted, started("x1", "make")),
				}
			},
			exists: existing(),
			want: Plan{
				Created: created("ck0"),
				Execs:   []PlannedExec{{Seq: 5, Started: started("x1", "make")}},
			},
			wantEnded: []bool{false},
		},
		{
			name: "a later checkpoint wins; only execs after it, in order",
			events: func(t *testing.T) []store.Event {
				return []store.Event{
					ev(t, 1, Created, created("ck0")),
					ev(t, 2, ExecStarted, started("x0", "setup")),
					ev(t, 3, ExecFinished, ExecFinishedData{Exec: "x0", ExitCode: intp(0)}),
					ev(t, 4, ExecStarted, started("xlong", "sleep", "100")), // started before, ends after
					ev(t, 5, CheckpointCreated, checkpoint("ck1")),
					ev(t, 6, ExecFinished, ExecFinishedData{Exec: "xlong", ExitCode: intp(0)}),
					ev(t, 7, ExecStarted, started("x1", "false")),
					ev(t, 8, ExecStarted, started("x2", "true")),
					ev(t, 9, ExecFinished, *zero),
					ev(t, 10, ExecFinished, *nonzero),
					ev(t, 11, Stopped, nil),
				}
			},
			exists: existing("ck0", "ck1"),
			want: Plan{
				Created:    created("ck0"),
				Checkpoint: "ck1",
				Execs: []PlannedExec{
					{Seq: 7, Started: started("x1", "false"), Finished: nonzero},
					{Seq: 8, Started: started("x2", "true"), Finished: zero},
				},
			},
			wantEnded: []bool{true, true},
		},
		{
			name: "latest checkpoint removed: falls back to the earlier one",
			events: func(t *testing.T) []store.Event {
				return []store.Event{
					ev(t, 1, Created, created("")),
					ev(t, 2, ExecStarted, started("x0", "setup")),
					ev(t, 3, CheckpointCreated, checkpoint("ck1")),
					ev(t, 4, ExecStarted, started("x1", "a")),
					ev(t, 5, CheckpointCreated, checkpoint("ck2")),
					ev(t, 6, ExecStarted, started("x2", "b")),
				}
			},
			exists: existing("ck1"),
			want: Plan{
				Created:    created(""),
				Checkpoint: "ck1",
				Execs: []PlannedExec{
					{Seq: 4, Started: started("x1", "a")},
					{Seq: 6, Started: started("x2", "b")},
				},
			},
			wantEnded: []bool{false, false},
		},
		{
			name: "every checkpoint removed: from the start",
			events: func(t *testing.T) []store.Event {
				return []store.Event{
					ev(t, 1, Created, created("")),
					ev(t, 2, ExecStarted, started("x0", "setup")),
					ev(t, 3, CheckpointCreated, checkpoint("ck1")),
					ev(t, 4, ExecStarted, started("x1", "a")),
				}
			},
			exists: existing(),
			want: Plan{
				Created: created(""),
				Execs: []PlannedExec{
					{Seq: 2, Started: started("x0", "setup")},
					{Seq: 4, Started: started("x1", "a")},
				},
			},
			wantEnded: []bool{false, false},
		},
		{
			name: "checkpoint event without an id is skipped",
			events: func(t *testing.T) []store.Event {
				return []store.Event{
					ev(t, 1, Created, created("")),
					ev(t, 2, CheckpointCreated, checkpoint("")),
					ev(t, 3, ExecStarted, started("x1", "a")),
				}
			},
			exists: func(string) bool { return true },
			want: Plan{
				Created: created(""),
				Execs:   []PlannedExec{{Seq: 3, Started: started("x1", "a")}},
			},
			wantEnded: []bool{false},
		},
		{
			name: "exec lost: not ended",
			events: func(t *testing.T) []store.Event {
				return []store.Event{
					ev(t, 1, Created, created("")),
					ev(t, 2, ExecStarted, started("x1", "serve")),
					ev(t, 3, ExecFinished, *lost),
				}
			},
			exists: existing(),
			want: Plan{
				Created: created(""),
				Execs:   []PlannedExec{{Seq: 2, Started: started("x1", "serve"), Finished: lost}},
			},
			wantEnded: []bool{false},
		},
		{
			name: "exec failed to start: ended",
			events: func(t *testing.T) []store.Event {
				return []store.Event{
					ev(t, 1, Created, created("")),
					ev(t, 2, ExecStarted, started("x1", "nope")),
					ev(t, 3, ExecFinished, *failed),
				}
			},
			exists: existing(),
			want: Plan{
				Created: created(""),
				Execs:   []PlannedExec{{Seq: 2, Started: started("x1", "nope"), Finished: failed}},
			},
			wantEnded: []bool{true},
		},
		{
			name: "second sandbox.created is ignored",
			events: func(t *testing.T) []store.Event {
				other := created("ck9")
				other.Image = "debian:12"
				return []store.Event{
					ev(t, 1, Created, created("")),
					ev(t, 2, ExecStarted, started("x1", "a")),
					ev(t, 3, Created, other),
					ev(t, 4, Created, `{not json`), // not even decoded
					ev(t, 5, ExecStarted, started("x2", "b")),
				}
			},
			exists: func(string) bool { return true },
			want: Plan{
				Created: created(""),
				Execs: []PlannedExec{
					{Seq: 2, Started: started("x1", "a")},
					{Seq: 5, Started: started("x2", "b")},
				},
			},
			wantEnded: []bool{false, false},
		},
		{
			name: "other event types are ignored",
			events: func(t *testing.T) []store.Event {
				return []store.Event{
					ev(t, 1, Created, created("")),
					ev(t, 2, Stopped, nil),
					ev(t, 3, Started, map[string]int{"pid": 1}),
					ev(t, 4, SnapshotCreated, map[string]string{"snapshot": "sn1"}),
					ev(t, 5, Forked, map[string]string{"checkpoint": "ck1"}),
					ev(t, 6, "sandbox.failed", `{"reason":"x"}`),
				}
			},
			exists: func(string) bool { return true },
			want:   Plan{Created: created("")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PlanResume(tt.events(t), tt.exists)
			if err != nil {
				t.Fatalf("PlanResume() error = %v, want nil", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("PlanResume() =\n  %s\nwant\n  %s", dump(got), dump(tt.want))
			}
			if len(got.Execs) != len(tt.wantEnded) {
				return
			}
			for i, pe := range got.Execs {
				if e := pe.Ended(); e != tt.wantEnded[i] {
					t.Errorf("Execs[%d] (%s).Ended() = %v, want %v", i, pe.Started.Exec, e, tt.wantEnded[i])
				}
			}
		})
	}
}

func dump(p Plan) string {
	b, _ := json.Marshal(p)
	return string(b)
}

func TestPlanResumeErrors(t *testing.T) {
	tests := []struct {
		name    string
		events  func(t *testing.T) []store.Event
		wantSub []string // the error mentions each
	}{
		{
			name:    "no events",
			events:  func(t *testing.T) []store.Event { return nil },
			wantSub: []string{Created},
		},
		{
			name: "no created event",
			events: func(t *testing.T) []store.Event {
				return []store.Event{
					ev(t, 1, ExecStarted, started("x1", "a")),
					ev(t, 2, CheckpointCreated, checkpoint("ck1")),
				}
			},
			wantSub: []string{Created},
		},
		{
			name: "malformed created",
			events: func(t *testing.T) []store.Event {
				return []store.Event{ev(t, 17, Created, `{"image":`)}
			},
			wantSub: []string{"17", Created},
		},
		{
			name: "created of the wrong shape",
			events: func(t *testing.T) []store.Event {
				return []store.Event{ev(t, 18, Created, `{"memory_bytes":"lots"}`)}
			},
			wantSub: []string{"18", Created},
		},
		{
			name: "malformed checkpoint_created",
			events: func(t *testing.T) []store.Event {
				return []store.Event{
					ev(t, 1, Created, created("")),
					ev(t, 23, CheckpointCreated, `[1,2]`),
				}
			},
			wantSub: []string{"23", CheckpointCreated},
		},
		{
			name: "malformed exec_started",
			events: func(t *testing.T) []store.Event {
				return []store.Event{
					ev(t, 1, Created, created("")),
					ev(t, 31, ExecStarted, `{"exec":"x1","argv":"not a list"}`),
				}
			},
			wantSub: []string{"31", ExecStarted},
		},
		{
			name: "malformed exec_finished",
			events: func(t *testing.T) []store.Event {
				return []store.Event{
					ev(t, 1, Created, created("")),
					ev(t, 2, ExecStarted, started("x1", "a")),
					ev(t, 42, ExecFinished, `{"exec":"x1","exit_code":"zero"}`),
				}
			},
			wantSub: []string{"42", ExecFinished},
		},
		{
			// Even before the base checkpoint, a broken exec_finished is
			// an error, not silently skipped.
			name: "malformed exec_finished before the checkpoint",
			events: func(t *testing.T) []store.Event {
				return []store.Event{
					ev(t, 1, Created, created("")),
					ev(t, 56, ExecFinished, `}`),
					ev(t, 57, CheckpointCreated, checkpoint("ck1")),
				}
			},
			wantSub: []string{"56"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := PlanResume(tt.events(t), func(string) bool { return true })
			if err == nil {
				t.Fatal("PlanResume() error = nil, want one")
			}
			for _, s := range tt.wantSub {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("PlanResume() error = %q, want it to mention %q", err, s)
				}
			}
		})
	}
}

func TestPlanResumeAsksExistsOnlyForCheckpoints(t *testing.T) {
	var asked []string
	events := []store.Event{
		ev(t, 1, Created, created("ck0")),
		ev(t, 2, ExecStarted, started("x1", "a")),
		ev(t, 3, CheckpointCreated, checkpoint("ck1")),
		ev(t, 4, ExecStarted, started("x2", "b")),
	}
	if _, err := PlanResume(events, func(id string) bool {
		asked = append(asked, id)
		return true
	}); err != nil {
		t.Fatalf("PlanResume() error = %v", err)
	}
	if want := []string{"ck0", "ck1"}; !reflect.DeepEqual(asked, want) {
		t.Errorf("exists was asked about %v, want %v", asked, want)
	}
}

func TestEndedAndLost(t *testing.T) {
	tests := []struct {
		name      string
		finished  *ExecFinishedData
		wantEnded bool
		wantLost  bool
	}{
		{"never finished", nil, false, false},
		{"exit 0", &ExecFinishedData{ExitCode: intp(0)}, true, false},
		{"exit non-zero", &ExecFinishedData{ExitCode: intp(2)}, true, false},
		{"killed by a signal", &ExecFinishedData{ExitCode: intp(137), Signal: 9}, true, false},
		{"timed out", &ExecFinishedData{ExitCode: intp(124), TimedOut: true}, true, false},
		{"oom killed", &ExecFinishedData{ExitCode: intp(137), OOM: true}, true, false},
		{"lost, no exit code", &ExecFinishedData{Error: LostError}, false, true},
		{"lost text but an exit code", &ExecFinishedData{ExitCode: intp(1), Error: LostError}, true, false},
		{"failed to start", &ExecFinishedData{Error: "no such file or directory"}, true, false},
		{"exit code and another error", &ExecFinishedData{ExitCode: intp(0), Error: "output truncated"}, true, false},
		{"similar to lost but not it", &ExecFinishedData{Error: LostError + "."}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pe := PlannedExec{Seq: 1, Started: started("x1", "a"), Finished: tt.finished}
			if got := pe.Ended(); got != tt.wantEnded {
				t.Errorf("Ended() = %v, want %v", got, tt.wantEnded)
			}
			if tt.finished == nil {
				return
			}
			if got := tt.finished.Lost(); got != tt.wantLost {
				t.Errorf("Lost() = %v, want %v", got, tt.wantLost)
			}
		})
	}
}

// The data structs round-trip through the JSON a ledger event holds, with
// the field names the API and older ledgers use.
func TestDataJSONNames(t *testing.T) {
	tests := []struct {
		v    any
		want string
	}{
		{ExecFinishedData{Exec: "x1", ExitCode: intp(0), OOM: true, DurationMS: 3},
			`{"exec":"x1","exit_code":0,"oom_killed":true,"duration_ms":3}`},
		{ExecFinishedData{Exec: "x1", Error: LostError},
			fmt.Sprintf(`{"exec":"x1","duration_ms":0,"error":%q}`, LostError)},
		{checkpoint("ck1"), `{"checkpoint":"ck1","kind":"checkpoint","freeze_ms":12}`},
		{ExecFinishedData{Exec: "x1", ExitCode: intp(0), DurationMS: 3, StdinBytes: 1, StdoutBytes: 2, StderrBytes: 3},
			`{"exec":"x1","exit_code":0,"duration_ms":3,"stdin_bytes":1,"stdout_bytes":2,"stderr_bytes":3}`},
		// The bounds at the top level, zero ones left out, env never.
		{func() CreatedData {
			d := CreatedOf(store.Shape{Image: "alpine:3", ImageDigest: "sha256:abc", Provider: "gvisor",
				Bounds: store.Bounds{MemoryBytes: 256, Pids: 8}, Env: []string{"SECRET=x"}})
			d.ForkedFrom = "src"
			return d
		}(), `{"image":"alpine:3","digest":"sha256:abc","provider":"gvisor","memory_bytes":256,"pids":8,"forked_from":"src"}`},
		{ExecStartedData{Exec: "x1", Argv: []string{"a"}, EnvNames: []string{"K"}, Replay: true},
			`{"exec":"x1","argv":["a"],"env_names":["K"],"replay":true}`},
	}
	for _, tt := range tests {
		b, err := json.Marshal(tt.v)
		if err != nil || string(b) != tt.want {
			t.Errorf("json.Marshal(%T) = %s, %v; want %s", tt.v, b, err, tt.want)
		}
	}
}

// Grant and policy changes after the plan's checkpoint are planned, in
// order, with their data; those before it are in the checkpoint already.
func TestPlanResumeChanges(t *testing.T) {
	pol := &store.Policy{Deny: []string{"192.0.2.0/24"}}
	events := []store.Event{
		ev(t, 1, Created, created("")),
		ev(t, 2, SecretGranted, GrantData{Secret: "early", Env: "EARLY"}),
		ev(t, 3, CheckpointCreated, checkpoint("ck1")),
		ev(t, 4, SecretGranted, GrantData{Secret: "key", Env: "KEY"}),
		ev(t, 5, ExecStarted, started("x1", "true")),
		ev(t, 6, PolicySet, pol),
		ev(t, 7, SecretUngranted, map[string]string{"secret": "key"}),
		ev(t, 8, PolicyCleared, nil),
		ev(t, 9, SecretGranted, GrantData{Secret: "cert", File: "/etc/cert"}),
	}
	p, err := PlanResume(events, existing("ck1"))
	if err != nil {
		t.Fatal(err)
	}
	want := []PlannedChange{
		{Seq: 4, Type: SecretGranted, Grant: GrantData{Secret: "key", Env: "KEY"}},
		{Seq: 6, Type: PolicySet, Policy: pol},
		{Seq: 7, Type: SecretUngranted, Grant: GrantData{Secret: "key"}},
		{Seq: 8, Type: PolicyCleared},
		{Seq: 9, Type: SecretGranted, Grant: GrantData{Secret: "cert", File: "/etc/cert"}},
	}
	if p.Checkpoint != "ck1" || len(p.Execs) != 1 || !reflect.DeepEqual(p.Changes, want) {
		t.Fatalf("plan: checkpoint %s, %d execs, changes %+v", p.Checkpoint, len(p.Execs), p.Changes)
	}
	if _, err := PlanResume(append(events, ev(t, 10, PolicySet, `{"deny":`)), existing("ck1")); err == nil {
		t.Error("a malformed policy_set was accepted")
	}
}

func TestCarries(t *testing.T) {
	for _, tc := range []struct {
		types          []string
		grants, policy bool
	}{
		{nil, false, false},
		{[]string{Created, ExecStarted}, false, false},
		{[]string{SecretGranted, SecretUngranted}, true, false},
		{[]string{PolicySet, PolicyCleared}, false, true},
		{[]string{SecretUngranted, PolicyCleared}, false, false},
	} {
		var events []store.Event
		for i, typ := range tc.types {
			events = append(events, ev(t, int64(i+1), typ, nil))
		}
		if g, p := Carries(events); g != tc.grants || p != tc.policy {
			t.Errorf("%v: grants %v policy %v, want %v %v", tc.types, g, p, tc.grants, tc.policy)
		}
	}
}
