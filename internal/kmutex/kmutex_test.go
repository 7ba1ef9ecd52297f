package kmutex

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// Lock serialises holders of one key, not of two; RLocks share a key and
// hold a Lock off; the table forgets a key nobody holds.
func TestKeyed(t *testing.T) {
	var k Keyed
	unlockA := k.Lock("a")
	k.Lock("b")() // another key is not held up
	var mu sync.Mutex
	var order []string
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	done := make(chan struct{})
	go func() {
		u := k.Lock("a")
		note("second")
		u()
		close(done)
	}()
	time.Sleep(30 * time.Millisecond)
	note("first")
	unlockA()
	unlockA() // idempotent
	<-done
	if len(order) != 2 || order[0] != "first" {
		t.Fatalf("order %v: the second holder of a key did not wait", order)
	}

	r1, r2 := k.RLock("c"), k.RLock("c") // shared
	locked := make(chan struct{})
	go func() { k.Lock("c")(); close(locked) }()
	select {
	case <-locked:
		t.Fatal("Lock of a key two RLocks hold did not wait")
	case <-time.After(30 * time.Millisecond):
	}
	r1()
	r2()
	<-locked
	if n := k.Len(); n != 0 {
		t.Fatalf("%d keys left in the table", n)
	}
}

// LockCtx gives up when its context ends, holding nothing and leaving no
// entry behind; the holder's unlock then frees the key as before.
func TestLockCtx(t *testing.T) {
	var k Keyed
	unlock := k.Lock("a")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if u, err := k.LockCtx(ctx, "a"); !errors.Is(err, context.DeadlineExceeded) || u != nil {
		t.Fatalf("LockCtx on a held key: held %t, %v; want the deadline", u != nil, err)
	}
	if n := k.Len(); n != 1 {
		t.Fatalf("%d keys after a wait gave up, want the holder's 1", n)
	}
	unlock()
	u, err := k.LockCtx(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	r := make(chan struct{})
	go func() { k.RLock("a")(); close(r) }()
	select {
	case <-r:
		t.Fatal("an RLock got a key held by LockCtx")
	case <-time.After(20 * time.Millisecond):
	}
	u()
	<-r
	if n := k.Len(); n != 0 {
		t.Fatalf("%d keys left", n)
	}
}
