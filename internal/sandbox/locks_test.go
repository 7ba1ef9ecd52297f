package sandbox

import (
	"testing"
	"time"
)

// A drop of a checkpoint waits for its uses; a use that begins after the
// drop waits for the drop (and then finds the record gone); the table of
// uses empties.
func TestCheckpointUseHoldsDrop(t *testing.T) {
	var c ckRefs
	use := c.use("ck1")
	other := c.use("ck2") // another checkpoint is not held up
	dropped, dropDone := make(chan struct{}), make(chan struct{})
	go func() {
		done := c.drop("ck1")
		close(dropped)
		time.Sleep(20 * time.Millisecond)
		done()
		close(dropDone)
	}()
	select {
	case <-dropped:
		t.Fatal("the drop did not wait for the use")
	case <-time.After(50 * time.Millisecond):
	}
	other()
	use()
	use() // release is idempotent
	<-dropped
	late := make(chan struct{})
	go func() { c.use("ck1")(); close(late) }()
	select {
	case <-late:
	case <-time.After(5 * time.Second):
		t.Fatal("a use after the drop never got its turn")
	}
	<-dropDone
	if n := c.size(); n != 0 {
		t.Fatalf("%d checkpoint uses left in the table", n)
	}
}
