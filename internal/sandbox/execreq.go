package sandbox

import (
	"encoding/json"
	"time"

	"github.com/useshards/shard/internal/agent/proto"
)

// The service's exec in its own terms: what internal/api (and the service
// itself: an environment's setup, a resume's replay) asks for, and what an
// exec's stream carries. The agent's protocol (internal/agent/proto) stays
// behind this boundary: agentRequest and execFrame translate, here and
// nowhere else.

// ExecRequest is a command to run in a sandbox.
type ExecRequest struct {
	Argv    []string
	Env     []string // K=V, over the sandbox's own environment and its env grants
	Workdir string   // absolute; "": the user's home (or /)
	User    string   // name, uid, name:group or uid:gid; "": root
	TTY     bool     // one terminal for stdin, stdout and stderr
	Rows    uint16   // the terminal's size; 0: 24×80
	Cols    uint16
	Stdin   bool          // stdin comes through ExecSession.Stdin; otherwise it is empty
	Timeout time.Duration // the command is killed past it; 0: never
}

// agentRequest is the agent's exec request for req.
func agentRequest(req ExecRequest) proto.Request {
	return proto.Request{Op: proto.OpExec, Argv: req.Argv, Env: req.Env, Dir: req.Workdir, User: req.User,
		TTY: req.TTY, Rows: req.Rows, Cols: req.Cols, Stdin: req.Stdin, TimeoutMS: timeoutMS(req.Timeout)}
}

// timeoutMS is d in whole milliseconds, rounded up: a timeout of less than
// one is still a timeout, not none.
func timeoutMS(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// ExecFrameKind is what an ExecFrame carries.
type ExecFrameKind uint8

const (
	ExecStdout ExecFrameKind = iota + 1 // Data: the command's stdout (all of a terminal's output)
	ExecStderr                          // Data: its stderr
	ExecExited                          // Exit: how it ended; the last frame
)

// ExecFrame is one frame of an exec's stream.
type ExecFrame struct {
	Kind ExecFrameKind
	Data []byte   // ExecStdout, ExecStderr: the caller's until its next Recv
	Exit ExecExit // ExecExited
}

// ExecExit is how a command ended.
type ExecExit struct {
	Code     int  // 128+Signal when a signal ended it
	Signal   int  // the signal that ended it, if any
	TimedOut bool // ended by its timeout
	OOM      bool // killed for the sandbox's memory
	// Error says why the server ended it: its sandbox stopped, was
	// removed or died, or did not end it at its timeout.
	Error string
	// What moved through its stdin, stdout and stderr, as the sandbox
	// counted it.
	StdinBytes, StdoutBytes, StderrBytes int64
	// OutputCut: a process it left behind held its output open; what that
	// process wrote later was not sent.
	OutputCut bool
}

// execFrame is the agent's exec frame typ (payload p) in the service's
// terms; ok is false for a frame that is neither output nor the exit.
func execFrame(typ byte, p []byte) (f ExecFrame, ok bool) {
	switch typ {
	case proto.FrameStdout:
		return ExecFrame{Kind: ExecStdout, Data: p}, true
	case proto.FrameStderr:
		return ExecFrame{Kind: ExecStderr, Data: p}, true
	case proto.FrameExit:
		// A payload that is not an exit says nothing more than "it
		// ended": the zero exit.
		var ex proto.Exit
		json.Unmarshal(p, &ex)
		return ExecFrame{Kind: ExecExited, Exit: execExit(ex)}, true
	}
	return ExecFrame{}, false
}

// execExit is the agent's exit in the service's terms.
func execExit(ex proto.Exit) ExecExit {
	return ExecExit{Code: ex.Code, Signal: ex.Signal, TimedOut: ex.TimedOut, OOM: ex.OOM, Error: ex.Error,
		StdinBytes: ex.StdinBytes, StdoutBytes: ex.StdoutBytes, StderrBytes: ex.StderrBytes, OutputCut: ex.OutputCut}
}
