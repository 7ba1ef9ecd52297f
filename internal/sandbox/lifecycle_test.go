package sandbox

import "testing"

// A sandbox stopped and started again has no stop time: it has not stopped
// since it started (the console and `shard inspect` showed a running
// sandbox as "Stopped <time>" from the last stop's).
func TestStartClearsStoppedAt(t *testing.T) {
	f := newFakeService(t)
	f.create("s1")
	stopped, err := f.svc.Stop(own(), "s1")
	if err != nil {
		t.Fatal(err)
	}
	if stopped.StoppedAt.IsZero() {
		t.Errorf("a stopped sandbox has no stop time")
	}
	started, err := f.svc.Start(own(), "s1")
	if err != nil {
		t.Fatal(err)
	}
	if started.State != StateRunning || !started.StoppedAt.IsZero() || started.StartedAt.Before(stopped.StoppedAt) {
		t.Errorf("started again: state %s, stopped_at %v, started_at %v; want running, no stop time, started after the stop",
			started.State, started.StoppedAt, started.StartedAt)
	}
}
