package cluster

import (
	"context"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// mirror is this node's copy of the cluster's keys (all but the sealed
// secrets, which are read when used), kept current by one watch. Calls
// read it instead of asking etcd: a call sent on to another node costs no
// etcd round trip, and with etcd away a node still knows where sandboxes
// live and which keys are valid. A key it lacks is read from etcd (it may
// be a moment old).
type mirror struct {
	prefix string

	mu     sync.RWMutex
	kv     map[string]entry // by key without the prefix; guarded by mu
	synced bool             // loaded, and the watch follows; guarded by mu
	loaded chan struct{}    // closed after the first load
	once   sync.Once
}

// entry is a key's value at a revision; gone marks a key this node removed
// (kept until a load at that revision or later, so a load that began
// before the removal does not bring the key back).
type entry struct {
	value []byte
	rev   int64
	gone  bool
}

func newMirror(prefix string) *mirror {
	return &mirror{prefix: prefix, kv: map[string]entry{}, loaded: make(chan struct{})}
}

func mirrored(key string) bool { return !strings.HasPrefix(key, "secrets/") }

func (m *mirror) get(key string) ([]byte, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	e, ok := m.kv[key]
	return e.value, ok && !e.gone
}

// list returns the values under a key prefix ("nodes/").
func (m *mirror) list(prefix string) [][]byte {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out [][]byte
	for k, e := range m.kv {
		if !e.gone && strings.HasPrefix(k, prefix) {
			out = append(out, e.value)
		}
	}
	return out
}

// wasLoaded reports whether the mirror has loaded etcd's keys once.
func (m *mirror) wasLoaded() bool {
	select {
	case <-m.loaded:
		return true
	default:
		return false
	}
}

// current reports whether the mirror follows etcd now.
func (m *mirror) current() bool { m.mu.RLock(); defer m.mu.RUnlock(); return m.synced }

// put records key's value at revision rev (this node's write, or the
// watch's), unless the mirror holds a later one.
func (m *mirror) put(key string, v []byte, rev int64) {
	if !mirrored(key) {
		return
	}
	m.mu.Lock()
	if m.kv[key].rev <= rev {
		m.kv[key] = entry{value: v, rev: rev}
	}
	m.mu.Unlock()
}

// del records that key is gone at revision rev.
func (m *mirror) del(key string, rev int64) {
	m.mu.Lock()
	if m.kv[key].rev <= rev {
		m.kv[key] = entry{rev: rev, gone: true}
	}
	m.mu.Unlock()
}

// run loads every key and follows every change until stop; a broken watch
// (etcd away, history compacted) starts over from a fresh load, which also
// drops what was removed meanwhile.
func (m *mirror) run(cli *clientv3.Client, stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done(): // run returned: this goroutine goes with it
		}
	}()
	for ctx.Err() == nil {
		lctx, lcancel := context.WithTimeout(ctx, Timeout)
		resp, err := cli.Get(lctx, m.prefix, clientv3.WithPrefix())
		lcancel()
		if err != nil {
			m.setSynced(false)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		at := resp.Header.Revision
		fresh := map[string]entry{}
		for _, kv := range resp.Kvs {
			if k := strings.TrimPrefix(string(kv.Key), m.prefix); mirrored(k) {
				fresh[k] = entry{value: kv.Value, rev: kv.ModRevision}
			}
		}
		m.replace(fresh, at)
		m.once.Do(func() { close(m.loaded) })
		wch := cli.Watch(clientv3.WithRequireLeader(ctx), m.prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range wch {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				k := strings.TrimPrefix(string(ev.Kv.Key), m.prefix)
				if ev.Type == clientv3.EventTypeDelete {
					m.del(k, ev.Kv.ModRevision)
				} else {
					m.put(k, ev.Kv.Value, ev.Kv.ModRevision)
				}
			}
		}
		m.setSynced(false)
	}
}

// replace takes a load made at revision at, keeping what this node wrote
// (or removed) after it.
func (m *mirror) replace(fresh map[string]entry, at int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, e := range m.kv {
		if e.rev > at {
			fresh[k] = e
		}
	}
	m.kv, m.synced = fresh, true
}

func (m *mirror) setSynced(ok bool) { m.mu.Lock(); m.synced = ok; m.mu.Unlock() }
