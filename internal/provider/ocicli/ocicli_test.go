package ocicli

import (
	"sync"
	"testing"
	"time"
)

func TestIDLocks(t *testing.T) {
	var l idLocks
	unlockA := l.lock("a")
	// Another id is not held up.
	done := make(chan struct{})
	go func() { l.lock("b")(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a lock of b waited for a's")
	}
	// The same id waits.
	got := make(chan struct{})
	go func() { u := l.lock("a"); close(got); u() }()
	select {
	case <-got:
		t.Fatal("a second lock of a did not wait for the first")
	case <-time.After(50 * time.Millisecond):
	}
	unlockA()
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the second lock of a never came")
	}
	// Many at once: one holder at a time, and nothing kept afterwards.
	var wg sync.WaitGroup
	var mu sync.Mutex
	in := 0
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := l.lock("c")
			mu.Lock()
			in++
			if in != 1 {
				t.Error("two holders of c at once")
			}
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			in--
			mu.Unlock()
			u()
		}()
	}
	wg.Wait()
	if n := l.k.Len(); n != 0 {
		t.Fatalf("%d locks kept after every holder left", n)
	}
}
