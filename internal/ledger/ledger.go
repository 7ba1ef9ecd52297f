// Package ledger names the events of a sandbox's ledger session and their
// data, and plans a resume from them. The events themselves live in the
// metadata store (internal/store), written in the same transaction as the
// change they record; this package is the pure logic over them.
package ledger

import (
	"encoding/json"
	"fmt"

	"github.com/useshards/shard/internal/store"
)

// Event types.
const (
	Created           = "sandbox.created"
	ExecStarted       = "sandbox.exec_started"
	ExecFinished      = "sandbox.exec_finished"
	CheckpointCreated = "sandbox.checkpoint_created"
	Forked            = "sandbox.forked"
	SnapshotCreated   = "sandbox.snapshot_created"
	Stopped           = "sandbox.stopped"
	Started           = "sandbox.started"
	Removed           = "sandbox.removed"
	Failed            = "sandbox.failed"
	SecretGranted     = "sandbox.secret_granted"
	SecretUngranted   = "sandbox.secret_ungranted"
	PolicySet         = "sandbox.policy_set" // data: the store.Policy
	PolicyCleared     = "sandbox.policy_cleared"
	FilesWritten      = "sandbox.files_written" // data: FilesData
	FilesRemoved      = "sandbox.files_removed" // data: FilesData
	ForkHook          = "sandbox.fork_hook"     // data: ForkHookData
	// ConnectionsRefused: the sandbox's new connections were refused by
	// the server's connection bounds (data: ConnectionsRefusedData); at
	// most one a minute while it goes on.
	ConnectionsRefused = "sandbox.connections_refused"
)

// ConnectionsRefusedData is what sandbox.connections_refused records.
type ConnectionsRefusedData struct {
	Refused int64  `json:"refused"` // new connections refused since the last such event
	Limit   int    `json:"limit"`   // the flows one sandbox may hold at once (shard serve --max-connections)
	Rate    int    `json:"rate"`    // the new flows a second one sandbox may open
	Message string `json:"message"`
}

// GrantData is what sandbox.secret_granted and sandbox.secret_ungranted
// record: the secret's name and where it goes, never its value.
type GrantData struct {
	Secret string `json:"secret"`
	Env    string `json:"env"`
	File   string `json:"file"`
}

// CreatedData is what sandbox.created records: enough to make the sandbox
// again (resume with no checkpoint starts from here).
type CreatedData struct {
	Image    string `json:"image"`
	Digest   string `json:"digest,omitempty"`
	Provider string `json:"provider"`
	store.Bounds
	Checkpoint   string `json:"checkpoint,omitempty"` // the sandbox started from this checkpoint
	ForkedFrom   string `json:"forked_from,omitempty"`
	ParentName   string `json:"parent_name,omitempty"`
	RestoredFrom string `json:"restored_from,omitempty"`
	ResumedFrom  string `json:"resumed_from,omitempty"` // a session
	FromSnapshot string `json:"from_snapshot,omitempty"`
	Environment  string `json:"environment,omitempty"`
	// FromNode is the node of a cluster whose checkpoint this sandbox was
	// restored from on this one (a fork whose source's node had no room).
	FromNode string `json:"from_node,omitempty"`
}

// CreatedOf is the sandbox.created data of a sandbox of shape sh (its
// environment is left out: values may be secrets); the caller adds where
// it came from.
func CreatedOf(sh store.Shape) CreatedData {
	return CreatedData{Image: sh.Image, Digest: sh.ImageDigest, Provider: sh.Provider, Bounds: sh.Bounds}
}

// ExecStartedData is what sandbox.exec_started records. Env values are
// never recorded, only names: they may be secrets.
type ExecStartedData struct {
	Exec      string   `json:"exec"`
	Argv      []string `json:"argv"`
	Cwd       string   `json:"cwd,omitempty"`
	User      string   `json:"user,omitempty"`
	EnvNames  []string `json:"env_names,omitempty"`
	TTY       bool     `json:"tty,omitempty"`
	Stdin     bool     `json:"stdin,omitempty"`
	TimeoutMS int64    `json:"timeout_ms,omitempty"`
	Replay    bool     `json:"replay,omitempty"` // run again by a resume
}

// ExecFinishedData is what sandbox.exec_finished records. ExitCode is nil
// when the command never ran (Error says why) or its end was not seen.
type ExecFinishedData struct {
	Exec       string `json:"exec"`
	ExitCode   *int   `json:"exit_code,omitempty"`
	Signal     int    `json:"signal,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	OOM        bool   `json:"oom_killed,omitempty"`
	DurationMS int64  `json:"duration_ms"`
	Error      string `json:"error,omitempty"`
	// Bytes the command read from its stdin and wrote to its stdout and
	// stderr, as the sandbox counted them (see proto.Exit).
	StdinBytes  int64 `json:"stdin_bytes,omitempty"`
	StdoutBytes int64 `json:"stdout_bytes,omitempty"`
	StderrBytes int64 `json:"stderr_bytes,omitempty"`
	// OutputCut: a process the command left behind held its output open
	// at its exit; what it wrote later was not sent (see proto.Exit).
	OutputCut bool `json:"output_cut,omitempty"`
}

// CheckpointData is what sandbox.checkpoint_created records.
type CheckpointData struct {
	Checkpoint string `json:"checkpoint"`
	Tag        string `json:"tag,omitempty"`
	Kind       string `json:"kind"`
	FreezeMS   int64  `json:"freeze_ms"`
	Memory     string `json:"memory,omitempty"` // how its memory reaches a restore: handoff or pages
	MemoryNote string `json:"memory_note,omitempty"`
}

// Plan is how to bring a session back: start from Checkpoint (or, when it
// is empty, make a fresh sandbox as Created says), then run Execs again and
// make Changes again, the two merged in the order of their Seq.
type Plan struct {
	Created    CreatedData
	Checkpoint string
	Execs      []PlannedExec
	Changes    []PlannedChange
}

// PlannedChange is a change of grants or policy to make again: the
// checkpoint holds the grants and policy of its instant, the ledger what
// changed after.
type PlannedChange struct {
	Seq    int64
	Type   string        // SecretGranted, SecretUngranted, PolicySet or PolicyCleared
	Grant  GrantData     // for the grant types
	Policy *store.Policy // for PolicySet
}

// PlannedExec is one exec to replay. Finished is nil for one that never
// finished (it is started again and left running); an exec whose end was
// seen only as a lost connection counts as never finished.
type PlannedExec struct {
	Seq      int64
	Started  ExecStartedData
	Finished *ExecFinishedData
}

// Ended reports whether the exec was seen to end (with a code, or failing
// to start).
func (p PlannedExec) Ended() bool {
	return p.Finished != nil && (p.Finished.ExitCode != nil || !p.Finished.Lost())
}

// Lost reports an exec whose connection to the sandbox broke before its end
// was seen.
func (f *ExecFinishedData) Lost() bool { return f.ExitCode == nil && f.Error == LostError }

// LostError is the error an exec_finished records when its end was not seen.
const LostError = "lost the connection to the sandbox before the command ended"

// PlanResume reads a session's events (in order) and picks the latest
// checkpoint that still exists — the session's own checkpoint_created
// events, or the checkpoint its sandbox started from — then lists the execs
// that started after it. exists says whether a checkpoint can still be
// restored.
func PlanResume(events []store.Event, exists func(id string) bool) (Plan, error) {
	var p Plan
	var baseSeq int64
	sawCreated := false
	for _, e := range events {
		switch e.Type {
		case Created:
			if sawCreated {
				continue
			}
			sawCreated = true
			if err := decode(e, &p.Created); err != nil {
				return p, err
			}
			if c := p.Created.Checkpoint; c != "" && exists(c) {
				p.Checkpoint, baseSeq = c, e.Seq
			}
		case CheckpointCreated:
			var d CheckpointData
			if err := decode(e, &d); err != nil {
				return p, err
			}
			if d.Checkpoint != "" && exists(d.Checkpoint) {
				p.Checkpoint, baseSeq = d.Checkpoint, e.Seq
			}
		}
	}
	if !sawCreated {
		return p, fmt.Errorf("the session has no sandbox.created event")
	}
	finished := map[string]*ExecFinishedData{}
	for _, e := range events {
		if e.Type == ExecFinished {
			var d ExecFinishedData
			if err := decode(e, &d); err != nil {
				return p, err
			}
			finished[d.Exec] = &d
		}
	}
	for _, e := range events {
		if e.Seq <= baseSeq {
			continue
		}
		switch e.Type {
		case ExecStarted:
			var d ExecStartedData
			if err := decode(e, &d); err != nil {
				return p, err
			}
			p.Execs = append(p.Execs, PlannedExec{Seq: e.Seq, Started: d, Finished: finished[d.Exec]})
		case SecretGranted, SecretUngranted, PolicySet, PolicyCleared:
			c := PlannedChange{Seq: e.Seq, Type: e.Type}
			var err error
			switch e.Type {
			case SecretGranted, SecretUngranted:
				err = decode(e, &c.Grant)
			case PolicySet:
				c.Policy = &store.Policy{}
				err = decode(e, c.Policy)
			}
			if err != nil {
				return p, err
			}
			p.Changes = append(p.Changes, c)
		}
	}
	return p, nil
}

// Carries reports whether a session's events give a sandbox resumed from
// it secret grants or a network policy of the session's own (beside what
// its checkpoints hold): who resumes it needs the scopes for those.
func Carries(events []store.Event) (grants, policy bool) {
	for _, e := range events {
		switch e.Type {
		case SecretGranted:
			grants = true
		case PolicySet:
			policy = true
		}
	}
	return grants, policy
}

func decode(e store.Event, v any) error {
	if len(e.Data) == 0 {
		return nil
	}
	if err := json.Unmarshal(e.Data, v); err != nil {
		return fmt.Errorf("ledger event %d (%s): %w", e.Seq, e.Type, err)
	}
	return nil
}

// FilesData is the data of files_written and files_removed: a change made
// to a sandbox's files through the files API (its bytes are not kept, so
// resume does not make it again).
type FilesData struct {
	Path      string `json:"path"`
	Tar       bool   `json:"tar,omitempty"`       // files_written: a tar unpacked into the directory Path
	Bytes     int64  `json:"bytes,omitempty"`     // files_written: bytes written
	Files     int    `json:"files,omitempty"`     // files_written: files, directories and links made
	Recursive bool   `json:"recursive,omitempty"` // files_removed
	Error     string `json:"error,omitempty"`     // files_written: the code of a write that stopped part way
}

// ForkHookData is the data of fork_hook: one on-fork hook's run, in a fork
// (role fork) or in the source of forks (role source).
type ForkHookData struct {
	Hook       string `json:"hook"`
	Role       string `json:"role"`
	ExitCode   int    `json:"exit_code"`
	Signal     int    `json:"signal,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	Error      string `json:"error,omitempty"` // it could not start
	DurationMS int64  `json:"duration_ms"`
	Output     string `json:"output,omitempty"` // its stdout and stderr, the last 16 KiB
}

// ForkedData is the data of forked, in the source's session: one fork made
// of it, from which checkpoint.
type ForkedData struct {
	Fork       string `json:"fork"`
	Name       string `json:"name"`
	Checkpoint string `json:"checkpoint"`
	Tag        string `json:"tag"`
}

// SnapshotCreatedData is the data of snapshot_created.
type SnapshotCreatedData struct {
	Snapshot string `json:"snapshot"`
	Name     string `json:"name"`
}

// SecretUngrantedData is the data of secret_ungranted.
type SecretUngrantedData struct {
	Secret string `json:"secret"`
}

// EndedData is the data of a stop or failure the server made on its own
// (stopped by reconcile, failed by the watcher): why.
type EndedData struct {
	Reason string `json:"reason"`
}

// Decode reads e's data into v (one of the *Data types of e.Type); an
// event with no data leaves v as it is.
func Decode(e store.Event, v any) error { return decode(e, v) }
