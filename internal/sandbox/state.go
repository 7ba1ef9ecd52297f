package sandbox

import (
	"fmt"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
)

// States of a sandbox. One table says which moves are allowed; every
// lifecycle step goes through transition, so no scattered ifs decide it.
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StateStopping = "stopping"
	StateStopped  = "stopped"
	StateStarting = "starting"
	StateRemoving = "removing"
	StateFailed   = "failed"
	StateFreezing = "freezing" // a fork holds it frozen for a moment
)

var transitions = map[string][]string{
	StateCreating: {StateRunning, StateFailed, StateRemoving},
	StateRunning:  {StateStopping, StateRemoving, StateFailed, StateStopped, StateFreezing},
	StateFreezing: {StateRunning, StateFailed, StateStopped, StateRemoving},
	StateStopping: {StateStopped, StateFailed, StateRemoving},
	StateStopped:  {StateStarting, StateRemoving},
	StateStarting: {StateRunning, StateStopped, StateFailed, StateRemoving},
	StateFailed:   {StateStarting, StateRemoving, StateStopped},
	StateRemoving: {StateRemoving},
}

func canMove(from, to string) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// transitionErr explains why a sandbox cannot move, in the user's words.
func transitionErr(name, from, to string) error {
	switch {
	case to == StateStarting && from == StateRunning:
		return errdefs.Conflict(client.CodeSandboxRunning, "sandbox %s is already running", name)
	case to == StateStopping && (from == StateStopped || from == StateFailed):
		return errdefs.Conflict(client.CodeSandboxNotRunning, "sandbox %s is not running", name)
	case from == StateCreating || from == StateStarting || from == StateStopping || from == StateRemoving:
		return errdefs.Conflict(client.CodeSandboxBusy, "sandbox %s is %s: try again when that is done", name, from)
	}
	return errdefs.Conflict(client.CodeInvalidState, "%s", fmt.Sprintf("sandbox %s is %s and cannot go to %s", name, from, to))
}
