package sandbox

import (
	"slices"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/errdefs"
)

var allStates = []string{
	StateCreating, StateRunning, StateStopping, StateStopped,
	StateStarting, StateRemoving, StateFailed, StateFreezing,
}

// The table, written out pair by pair: a change to transitions must be a
// deliberate change here too.
var wantMoves = map[[2]string]bool{
	{StateCreating, StateRunning}:  true,
	{StateCreating, StateFailed}:   true,
	{StateCreating, StateRemoving}: true,

	{StateRunning, StateStopping}: true,
	{StateRunning, StateRemoving}: true,
	{StateRunning, StateFailed}:   true,
	{StateRunning, StateStopped}:  true, // the sandbox died on its own
	{StateRunning, StateFreezing}: true, // a fork starts

	{StateFreezing, StateRunning}:  true, // the fork has its image: thaw
	{StateFreezing, StateFailed}:   true,
	{StateFreezing, StateStopped}:  true, // died while frozen
	{StateFreezing, StateRemoving}: true,

	{StateStopping, StateStopped}:  true,
	{StateStopping, StateFailed}:   true,
	{StateStopping, StateRemoving}: true,

	{StateStopped, StateStarting}: true,
	{StateStopped, StateRemoving}: true,

	{StateStarting, StateRunning}:  true,
	{StateStarting, StateStopped}:  true,
	{StateStarting, StateFailed}:   true,
	{StateStarting, StateRemoving}: true,

	{StateFailed, StateStarting}: true,
	{StateFailed, StateRemoving}: true,
	{StateFailed, StateStopped}:  true,

	{StateRemoving, StateRemoving}: true, // a remove that failed half-way is retried
}

func TestTransitionsTableCoversEveryState(t *testing.T) {
	for _, s := range allStates {
		if _, ok := transitions[s]; !ok {
			t.Errorf("transitions has no entry for state %q", s)
		}
	}
	for from, tos := range transitions {
		if !slices.Contains(allStates, from) {
			t.Errorf("transitions has an unknown state %q", from)
		}
		for _, to := range tos {
			if !slices.Contains(allStates, to) {
				t.Errorf("transitions[%q] has an unknown state %q", from, to)
			}
		}
		if len(slices.Compact(slices.Sorted(slices.Values(tos)))) != len(tos) {
			t.Errorf("transitions[%q] = %q has duplicates", from, tos)
		}
	}
}

func TestCanMove(t *testing.T) {
	for _, from := range allStates {
		for _, to := range allStates {
			want := wantMoves[[2]string{from, to}]
			if got := canMove(from, to); got != want {
				t.Errorf("canMove(%q, %q) = %v, want %v", from, to, got, want)
			}
			// canMove is exactly the table.
			if inTable := slices.Contains(transitions[from], to); canMove(from, to) != inTable {
				t.Errorf("canMove(%q, %q) = %v, but the table says %v", from, to, canMove(from, to), inTable)
			}
		}
	}
}

func TestCanMoveUnknownStates(t *testing.T) {
	tests := []struct{ from, to string }{
		{"", StateRunning},
		{StateRunning, ""},
		{"bogus", StateRemoving},
		{StateStopped, "bogus"},
		{"Running", StateStopping}, // states are case sensitive
	}
	for _, tt := range tests {
		if canMove(tt.from, tt.to) {
			t.Errorf("canMove(%q, %q) = true, want false", tt.from, tt.to)
		}
	}
}

// Every state can be removed, and no state can go back to creating.
func TestTransitionInvariants(t *testing.T) {
	for _, from := range allStates {
		if !canMove(from, StateRemoving) {
			t.Errorf("canMove(%q, removing) = false, want every sandbox removable", from)
		}
		if canMove(from, StateCreating) {
			t.Errorf("canMove(%q, creating) = true, want creating to be only initial", from)
		}
	}
	for _, to := range allStates {
		if to != StateRemoving && canMove(StateRemoving, to) {
			t.Errorf("canMove(removing, %q) = true, want removing to be final", to)
		}
	}
}

func TestTransitionErr(t *testing.T) {
	tests := []struct {
		from, to string
		wantCode string
		wantMsg  string
	}{
		// start
		{StateRunning, StateStarting, "sandbox_running", "sandbox sb is already running"},
		{StateCreating, StateStarting, "sandbox_busy", "sandbox sb is creating"},
		{StateStarting, StateStarting, "sandbox_busy", "sandbox sb is starting"},
		{StateStopping, StateStarting, "sandbox_busy", "sandbox sb is stopping"},
		{StateRemoving, StateStarting, "sandbox_busy", "sandbox sb is removing"},
		// stop
		{StateStopped, StateStopping, "sandbox_not_running", "sandbox sb is not running"},
		{StateFailed, StateStopping, "sandbox_not_running", "sandbox sb is not running"},
		{StateCreating, StateStopping, "sandbox_busy", "try again"},
		{StateStarting, StateStopping, "sandbox_busy", "sandbox sb is starting"},
		{StateStopping, StateStopping, "sandbox_busy", "sandbox sb is stopping"},
		{StateRemoving, StateStopping, "sandbox_busy", "sandbox sb is removing"},
		// anything else out of a busy state
		{StateCreating, StateStopped, "sandbox_busy", "sandbox sb is creating"},
		{StateRemoving, StateRunning, "sandbox_busy", "sandbox sb is removing"},
		{StateStopping, StateRunning, "sandbox_busy", "sandbox sb is stopping"},
		// the rest
		{StateStopped, StateRunning, "invalid_state", "sandbox sb is stopped and cannot go to running"},
		{StateRunning, StateRunning, "invalid_state", "sandbox sb is running and cannot go to running"},
		{StateFailed, StateRunning, "invalid_state", "sandbox sb is failed and cannot go to running"},
		{StateStopped, StateFailed, "invalid_state", "cannot go to failed"},
	}
	for _, tt := range tests {
		err := transitionErr("sb", tt.from, tt.to)
		if err == nil {
			t.Errorf("transitionErr(sb, %q, %q) = nil, want an error", tt.from, tt.to)
			continue
		}
		if got := errdefs.CodeOf(err); got != tt.wantCode {
			t.Errorf("transitionErr(sb, %q, %q) code = %q, want %q", tt.from, tt.to, got, tt.wantCode)
		}
		if got := errdefs.KindOf(err); got != errdefs.KindConflict {
			t.Errorf("transitionErr(sb, %q, %q) kind = %q, want %q", tt.from, tt.to, got, errdefs.KindConflict)
		}
		if !strings.Contains(err.Error(), tt.wantMsg) {
			t.Errorf("transitionErr(sb, %q, %q) = %q, want it to contain %q", tt.from, tt.to, err, tt.wantMsg)
		}
	}
}

// Every refused move gets a conflict error naming the sandbox.
func TestTransitionErrForEveryRefusedMove(t *testing.T) {
	for _, from := range allStates {
		for _, to := range allStates {
			if canMove(from, to) {
				continue
			}
			err := transitionErr("my-box", from, to)
			if errdefs.KindOf(err) != errdefs.KindConflict || !strings.Contains(err.Error(), "my-box") {
				t.Errorf("transitionErr(my-box, %q, %q) = %v (kind %q), want a conflict naming my-box", from, to, err, errdefs.KindOf(err))
			}
		}
	}
}
