package proto

import "time"

// The fork contract: what a sandbox learns of its own identity, and what
// changes when it is forked (or restored: a restore is a fork of the
// checkpoint's instant). See the README's "Forks that know they were
// forked".

// Identity is who a sandbox is, as /run/shard/fork says it.
type Identity struct {
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	ParentID   string    `json:"parent_id,omitempty"`
	ParentName string    `json:"parent_name,omitempty"`
	Checkpoint string    `json:"checkpoint,omitempty"` // the checkpoint it started from
	Generation int       `json:"generation"`           // forks between it and the sandbox its lineage began with
	ForkedAt   time.Time `json:"forked_at,omitzero"`   // when it was made from its parent
}

// EnvIdentity carries the sandbox's Identity (JSON) to the agent at boot.
const EnvIdentity = "SHARD_AGENT_IDENTITY"

// ForkFile is where a sandbox reads its Identity; the agent replaces it
// (a rename into /run/shard, which inotify sees) when the sandbox is forked.
const ForkFile = "/run/shard/fork"

// HooksDir holds the executables a fork runs right after it resumes.
const HooksDir = "/etc/shard/on-fork.d"

// Roles of a hook run (Forked.Role).
const (
	RoleFork   = "fork"
	RoleSource = "source"
)

// Forked is OpForked's request: the new identity of a fork (Role fork),
// or, for the source of a fork (Role source), the fork's, and whether and
// how to run the hooks.
type Forked struct {
	Role          string   `json:"role"`
	Identity      Identity `json:"identity"`
	Hooks         bool     `json:"hooks"`
	HookTimeoutMS int64    `json:"hook_timeout_ms"`
	// KeepGoing runs every hook even after one failed (errors ignored).
	KeepGoing bool `json:"keep_going,omitempty"`
}

// HookResult is one hook's run.
type HookResult struct {
	Hook       string `json:"hook"`
	ExitCode   int    `json:"exit_code"`
	Signal     int    `json:"signal,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	Error      string `json:"error,omitempty"` // it could not start
	DurationMS int64  `json:"duration_ms"`
	Output     string `json:"output,omitempty"` // stdout and stderr, at most MaxHookOutput bytes (its end)
}

// Failed reports a hook that did not exit 0.
func (h HookResult) Failed() bool {
	return h.ExitCode != 0 || h.Signal != 0 || h.TimedOut || h.Error != ""
}

// MaxHookOutput bounds the output of a hook that is kept.
const MaxHookOutput = 16 << 10

// MaxHooks bounds how many hooks run.
const MaxHooks = 64
