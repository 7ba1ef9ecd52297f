package sandbox

import "time"

// timeline records when each phase of an operation ended, for the debug
// log: where a slow fork spent its time.
type timeline struct {
	start time.Time
	marks []any // name, time since start, ...
}

func newTimeline() *timeline { return &timeline{start: time.Now()} }

func (t *timeline) mark(name string) {
	t.marks = append(t.marks, name, time.Since(t.start).Round(100*time.Microsecond))
}

// at is when the mark name was made (0 if never).
func (t *timeline) at(name string) time.Duration {
	for i := 0; i+1 < len(t.marks); i += 2 {
		if t.marks[i] == name {
			return t.marks[i+1].(time.Duration)
		}
	}
	return 0
}

// attrs is the marks as slog key-value pairs.
func (t *timeline) attrs() []any { return t.marks }
