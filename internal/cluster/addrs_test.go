package cluster

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/useshards/shard/internal/cluster/etcdtest"
)

// TestClusterAddrs: a node is told the cluster's addresses (etcd's, every
// node's advertised one and those it publishes of itself) when it joins and after its heartbeats; while etcd cannot
// be read it keeps what it knew.
func TestClusterAddrs(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	var mu sync.Mutex
	var last []netip.Addr
	open := func(name, advertise string, onAddrs func([]netip.Addr), own ...string) *Cluster {
		c, err := Open(context.Background(), Config{Endpoints: etcd.Endpoints(), Node: name, Instance: "i-" + name, Advertise: advertise,
			Key: testKey, TTL: 3 * time.Second, Log: slog.New(slog.DiscardHandler), Prefix: "/addrs/", OnAddrs: onAddrs,
			Stats: func() Stats { return Stats{Addrs: own} }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a := open("a", "https://198.51.100.1:7071", func(as []netip.Addr) { mu.Lock(); last = as; mu.Unlock() })
	has := func(want ...string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, w := range want {
			if !slices.Contains(last, netip.MustParseAddr(w)) {
				return false
			}
		}
		return true
	}
	if !has("127.0.0.1", "198.51.100.1") { // etcd's (its client and peer URLs), a's own
		t.Fatalf("after joining: %v", last)
	}
	a.Start(nil)
	open("b", "https://198.51.100.2:7071", nil, "198.51.100.2", "203.0.113.9") // b's API may listen on another of its addresses
	deadline := time.Now().Add(5 * time.Second)
	for !has("198.51.100.2", "203.0.113.9") {
		if time.Now().After(deadline) {
			t.Fatalf("node b's address not told within a heartbeat and more: %v", last)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// etcd away: what was known stays.
	etcd.Kill(0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	a.refreshAddrs(ctx)
	cancel()
	if !has("127.0.0.1", "198.51.100.1", "198.51.100.2", "203.0.113.9") {
		t.Fatalf("with etcd away: %v", last)
	}
}
