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
	kv     map[string][]byte // by key without the prefix; guarded by mu
	synced bool              // loaded, and the watch follows; guarded by mu
	loaded chan struct{}     // closed after the first load
	once   sync.Once
}

func newMirror(prefix string) *mirror {
	return &mirror{prefix: prefix, kv: map[string][]byte{}, loaded: make(chan struct{})}
}

func mirrored(key string) bool { return !strings.HasPrefix(key, "secrets/") }

func (m *mirror) get(key string) ([]byte, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	v, ok := m.kv[key]
	return v, ok
}

// list returns the values under a key prefix ("nodes/").
func (m *mirror) list(prefix string) [][]byte {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out [][]byte
	for k, v := range m.kv {
		if strings.HasPrefix(k, prefix) {
			out = append(out, v)
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

func (m *mirror) put(key string, v []byte) {
	if !mirrored(key) {
		return
	}
	m.mu.Lock()
	m.kv[key] = v
	m.mu.Unlock()
}

func (m *mirror) del(key string) { m.mu.Lock(); delete(m.kv, key); m.mu.Unlock() }

// run loads every key and follows every change until stop; a broken watch
// (etcd away, history compacted) starts over from a fresh load, which also
// drops what was removed meanwhile.
func (m *mirror) run(cli *clientv3.Client, stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-stop; cancel() }()
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
		fresh := map[string][]byte{}
		for _, kv := range resp.Kvs {
			if k := strings.TrimPrefix(string(kv.Key), m.prefix); mirrored(k) {
				fresh[k] = kv.Value
			}
		}
		m.mu.Lock()
		m.kv, m.synced = fresh, true
		m.mu.Unlock()
		m.once.Do(func() { close(m.loaded) })
		wch := cli.Watch(clientv3.WithRequireLeader(ctx), m.prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range wch {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				k := strings.TrimPrefix(string(ev.Kv.Key), m.prefix)
				if ev.Type == clientv3.EventTypeDelete {
					m.del(k)
				} else {
					m.put(k, ev.Kv.Value)
				}
			}
		}
		m.setSynced(false)
	}
}

func (m *mirror) setSynced(ok bool) { m.mu.Lock(); m.synced = ok; m.mu.Unlock() }
