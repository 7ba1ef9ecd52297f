package sandbox

import (
	"testing"
	"time"
)

func TestConnRefusalsDue(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var c connRefusals
	for _, tc := range []struct {
		step string
		id   string
		n    uint64
		at   time.Duration
		want uint64
	}{
		{"first refusal: at once", "a", 5, 0, 5},
		{"within the minute: held", "a", 7, 10 * time.Second, 0},
		{"still within: held", "a", 1, 59 * time.Second, 0},
		{"another sandbox: its own", "b", 2, 59 * time.Second, 2},
		{"a minute on: all since", "a", 3, 61 * time.Second, 11},
		{"again within: held", "a", 1, 70 * time.Second, 0},
	} {
		if got := c.due(tc.id, tc.n, t0.Add(tc.at)); got != tc.want {
			t.Errorf("%s: due %d, want %d", tc.step, got, tc.want)
		}
	}
}
