// Package proto is the protocol between shard and the agent that runs as
// PID 1 inside every sandbox (internal/agent/guest) and its host-side client
// (internal/agent/host): the requests and replies, the frame types of an
// exec, the ops and capabilities, and what the host passes the agent at
// boot. It is shard's own, not the API's: the API's exec is the sandbox
// service's (sandbox.ExecRequest, ExecFrame), translated to and from this
// at the sandbox's boundary (internal/sandbox/execreq.go).
//
// Why an agent: `runsc exec` costs ~27 ms a call on this kind of host, while a
// process already inside the sandbox answers in well under a millisecond and
// spawns a command in ~10 ms. It listens on TCP on the sandbox's own network
// stack (not a host Unix socket: gVisor cannot checkpoint a sandbox with a
// bound host socket), so it survives checkpoint/restore and a fork answers at
// its new address.
//
// The wire format is a stream of frames (internal/framing). The first frame
// from the client is a Request (JSON).
package proto

import (
	"slices"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/framing"
)

// Frame types. Client to agent: FrameRequest, FrameStdin, FrameResize,
// FrameSignal, FrameDetach. Agent to client: FrameStarted, FrameStdout,
// FrameStderr, FrameCredit, FrameExit, FrameError, FrameReply.
//
// An agent ignores frame types it does not know, so a newer host may send
// them to an older agent; what an agent understands beyond the first
// version is listed in Started.Caps, and a host sends FrameDetach or waits
// for FrameCredit only when the agent said it can.
const (
	FrameRequest byte = 'Q' // JSON Request
	FrameStdin   byte = 'I' // raw bytes; empty payload closes stdin
	FrameResize  byte = 'R' // JSON Resize
	FrameSignal  byte = 'K' // JSON Signal
	FrameStarted byte = 'S' // JSON Started
	FrameStdout  byte = 'O' // raw bytes
	FrameStderr  byte = 'E' // raw bytes
	FrameExit    byte = 'X' // JSON Exit
	FrameError   byte = 'F' // JSON ErrorInfo: the command could not start
	FrameReply   byte = 'P' // JSON reply to a non-exec op

	// FrameDetach (no payload): nobody reads this exec's output any more.
	// The agent keeps draining the command's output (so it never blocks on
	// a full pipe) but sends none of it; the command runs on to its end or
	// timeout and its FrameExit still comes. (CapDetach)
	FrameDetach byte = 'D'
	// FrameCredit: JSON Credit. The agent wrote that many stdin bytes to
	// the command, so the client may send that many more: a client sends at
	// most Started.StdinWindow bytes of stdin not yet credited, and a
	// command that does not read its stdin holds up the client, not the
	// sandbox's memory. Signals, resizes and FrameDetach are never held up
	// behind stdin. (CapStdinCredit)
	FrameCredit byte = 'C'
)

// Capabilities: what an agent can do beyond the first version of the
// protocol. An agent lists all of its own in ping's Reply.Caps and in an
// exec's Started.Caps; a host decides what to send by them, never by the
// words of a refusal.
//
// Version skew: a sandbox keeps the agent it started with (a checkpoint
// and every fork of it too), so a host talks to agents older than itself.
// An agent from before ping listed caps answers with none: a host takes it
// to have LegacyCaps. An agent older still may lack one of those ops; it
// refuses it in words only ("unknown op <op>"), which host.Client.Do reads
// for such an agent alone (a newer one sets Reply.UnknownOp).
const (
	CapDetach      = "detach"       // understands FrameDetach
	CapStdinCredit = "stdin_credit" // sends FrameCredit; honour Started.StdinWindow
	CapMemCheck    = OpMemCheck     // answers mem_check
	CapGrantFile   = OpGrantFile    // answers grant_file and ungrant_file
	CapForked      = OpForked       // answers forked (the fork contract)
)

// LegacyCaps are the ops of the last agent that listed no caps in its ping
// reply. (Its exec's Started.Caps listed detach and stdin_credit: a session
// learns those from its own Started, from agents of either kind.)
var LegacyCaps = Caps{CapMemCheck, CapGrantFile, CapForked}

// Caps is an agent's list of capabilities.
type Caps []string

// Has reports whether the list holds capability c.
func (cs Caps) Has(c string) bool { return slices.Contains(cs, c) }

// MaxFrame bounds a frame's payload so a broken peer cannot make us allocate
// without limit.
const MaxFrame = framing.Max

// Port is the TCP port the agent listens on inside every sandbox.
const Port = 4951

// Ops a Request can carry.
const (
	OpExec  = "exec"
	OpPing  = "ping"  // answers Reply{OK}; used for readiness
	OpSync  = "sync"  // flushes file data to the host (before stop)
	OpStats = "stats" // memory use and OOM kills seen inside
	// OpMemCheck: the host saw the sandbox's memory cgroup move; the OOM
	// guard watches for a while (gVisor). Answers WatchMS.
	OpMemCheck = "mem_check"
	// OpGrantFile writes Data to Path (mode Mode), atomically: a secret
	// granted as a file. It follows no symlink on the way and replaces
	// nothing, unless Replace (the grant wrote Path before) and what is
	// there still looks like what it wrote. Missing parent directories are
	// made and listed in Reply.Made. Refusals carry Reply.Code
	// (CodePathExists, CodePathUnsafe). (It replaces put_file, which
	// replaced whatever was at the path: an agent that only knows that op
	// refuses it as unknown.)
	OpGrantFile = "grant_file"
	// OpUngrantFile removes Path if it is still what the grant wrote (a
	// regular file of mode Mode, reached by no symlink), then the
	// directories Dirs the grant made, those that are empty; absent is
	// fine. What it leaves is said in Reply.Left.
	OpUngrantFile = "ungrant_file"
	// OpForked: the sandbox was just made from a checkpoint (Forked.Role
	// fork: a new machine-id, ForkFile rewritten) or is the source of a
	// fork (role source); then the on-fork hooks run. Answers Reply.Hooks.
	OpForked = "forked"
)

// Request is the first frame of every connection.
type Request struct {
	Token string `json:"token"`
	Op    string `json:"op"`

	Argv      []string `json:"argv,omitempty"`
	Env       []string `json:"env,omitempty"` // K=V, added to the sandbox's own environment
	Dir       string   `json:"dir,omitempty"`
	User      string   `json:"user,omitempty"` // name, uid, name:group or uid:gid
	TTY       bool     `json:"tty,omitempty"`
	Rows      uint16   `json:"rows,omitempty"`
	Cols      uint16   `json:"cols,omitempty"`
	Stdin     bool     `json:"stdin,omitempty"`      // the client will send stdin frames; otherwise stdin is empty
	TimeoutMS int64    `json:"timeout_ms,omitempty"` // 0: no timeout

	// grant_file and ungrant_file
	Path    string   `json:"path,omitempty"`
	Data    []byte   `json:"data,omitempty"`
	Mode    uint32   `json:"mode,omitempty"`
	Replace bool     `json:"replace,omitempty"` // grant_file: the grant owns Path
	Dirs    []string `json:"dirs,omitempty"`    // ungrant_file: directories the grant made

	Forked *Forked `json:"forked,omitempty"` // forked
}

// Resize changes the TTY's window size.
type Resize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Signal asks the agent to send a signal to the command's process group.
type Signal struct {
	Signal int `json:"signal"`
}

// Started reports the pid (as seen inside) of a started command, and what
// the agent can do beyond the first version of the protocol (an older agent
// sends no Caps).
type Started struct {
	PID         int  `json:"pid"`
	Caps        Caps `json:"caps,omitempty"`
	StdinWindow int  `json:"stdin_window,omitempty"` // with CapStdinCredit: bytes of stdin the client may send before its first credit
}

// Credit gives the client back stdin window: Bytes more may be sent.
type Credit struct {
	Bytes int `json:"bytes"`
}

// Exit is the last frame of an exec.
type Exit struct {
	Code     int    `json:"exit_code"`
	Signal   int    `json:"signal,omitempty"`    // the signal that ended it, if any
	TimedOut bool   `json:"timed_out,omitempty"` // ended by the exec's timeout
	OOM      bool   `json:"oom_killed,omitempty"`
	Error    string `json:"error,omitempty"`
	// What moved through the command's stdio by its exit, as the agent
	// counted it: written into its stdin, read from its stdout and stderr
	// (a terminal's output is all stdout). Output dropped for a client
	// that let go is counted too: it is what the command wrote.
	StdinBytes  int64 `json:"stdin_bytes,omitempty"`
	StdoutBytes int64 `json:"stdout_bytes,omitempty"`
	StderrBytes int64 `json:"stderr_bytes,omitempty"`
	// OutputCut: the exit was sent while a process the command left behind
	// still held its output open; what that process writes later is not
	// sent. (The output the command wrote before its exit is.)
	OutputCut bool `json:"output_cut,omitempty"`
}

// ErrorInfo says why a command could not start (unknown program, bad user...).
type ErrorInfo struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *ErrorInfo) Error() string { return e.Message }

// Codes a grant file op answers with in Reply.Code; the host maps them to
// its API codes.
const (
	// CodePathExists: something is at the path already that this grant
	// did not write (or no longer looks like what it wrote).
	CodePathExists = client.CodePathExists
	// CodePathUnsafe: a directory on the path is a symlink or not a
	// directory at all.
	CodePathUnsafe = client.CodePathUnsafe
)

// Reply answers the non-exec ops.
type Reply struct {
	OK          bool   `json:"ok"`
	Error       string `json:"error,omitempty"`
	MemoryUsed  int64  `json:"memory_used,omitempty"`
	MemoryLimit int64  `json:"memory_limit,omitempty"`
	OOMKills    int64  `json:"oom_kills,omitempty"`
	// WatchMS answers mem_check: the guard keeps watching at least this
	// long from now, so the host need not ask again before then.
	WatchMS int64 `json:"watch_ms,omitempty"`

	// Caps answers ping: what the agent can do (Cap*). An agent from
	// before caps lists none (see LegacyCaps).
	Caps Caps `json:"caps,omitempty"`
	// UnknownOp marks the refusal of an op the agent does not have: it is
	// older than the op.
	UnknownOp bool `json:"unknown_op,omitempty"`

	Code string   `json:"code,omitempty"` // a refusal's code (CodePathExists, ...)
	Made []string `json:"made,omitempty"` // grant_file: directories made, outermost first
	Left string   `json:"left,omitempty"` // ungrant_file: what was not removed, and why

	Hooks []HookResult `json:"hooks,omitempty"` // forked: the hooks that ran, in order
}
