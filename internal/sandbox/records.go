package sandbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"time"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/store"
)

// randomHex is n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// newID is a sandbox (or checkpoint) id: 12 hex digits, a fixed length, so
// that no id is a prefix of another (runsc matches ids by prefix).
func newID() string { return randomHex(6) }

func newToken() string { return randomHex(24) }

// move changes a sandbox's state if the table allows it.
func (s *Service) move(ctx context.Context, id, to string, ev *store.EventSpec, also func(*store.Sandbox)) (*store.Sandbox, error) {
	out, err := s.cfg.Store.UpdateSandbox(ctx, id, func(r *store.Sandbox) (*store.EventSpec, error) {
		if !canMove(r.State, to) {
			return nil, transitionErr(r.Name, r.State, to)
		}
		r.State = to
		if to == StateRunning {
			// Running again, it has not stopped since: the last stop's
			// time would read as if it were stopped now.
			r.StoppedAt = time.Time{}
		}
		if also != nil {
			also(r)
		}
		return ev, nil
	})
	if err == nil && to == StateRunning {
		s.watch.watchSandbox(id)
	}
	return out, err
}

// insertRecords gives each of protos an id, a name (the id if it has none),
// an address and a ledger session, and writes them in state creating with
// their sandbox.created events. created returns the session's name ("" for
// the sandbox's name) and the event's data. A proto that has an id already
// (a sandbox made ahead's, see ahead.go) keeps it, and its reserved address.
//
// The whole batch is admitted at once (quotas, host memory: admission.go)
// and written under the admission lock, so a fork of --count 10 is made
// whole or not at all, and no other request spends its room meanwhile.
func (s *Service) insertRecords(ctx context.Context, protos []*store.Sandbox, created func(*store.Sandbox) (string, ledger.CreatedData)) ([]*store.Sandbox, error) {
	if len(protos) == 0 {
		return nil, nil
	}
	var add use
	for _, r := range protos {
		u := newSandboxUse(r)
		add = use{sandboxes: add.sandboxes + u.sandboxes, memory: add.memory + u.memory, cpu: add.cpu + u.cpu, disk: add.disk + u.disk}
	}
	what := "sandbox " + cmp.Or(protos[0].Name, "(unnamed)")
	if len(protos) > 1 {
		what = fmt.Sprintf("%d sandboxes", len(protos))
	}
	var out []*store.Sandbox
	err := s.adm.admit(ctx, protos[0], add, what, func() error {
		for _, r := range protos {
			write := func(id string, ip netip.Addr) error {
				r.ID, r.IP, r.State, r.CreatedAt = id, ip.String(), StateCreating, time.Now().UTC()
				if r.Name == "" {
					r.Name = r.ID
				}
				session, data := created(r)
				r.Session = cmp.Or(session, r.Name)
				return s.cfg.Store.CreateSandbox(ctx, r, &store.EventSpec{Type: ledger.Created, Data: data})
			}
			var err error
			if r.ID != "" {
				// A sandbox made ahead's: its id and reserved address are
				// the record's now, and its hold ends (a.mu is held).
				id, ip := r.ID, r.IP
				err = s.addrs.Claim(ip, func() error {
					addr, err := netip.ParseAddr(ip)
					if err != nil {
						return err
					}
					if err := write(id, addr); err != nil {
						return err
					}
					delete(s.adm.ahead, id)
					return nil
				})
			} else {
				err = s.addrs.Take(func(ip netip.Addr) error { return write(newID(), ip) })
			}
			if err != nil {
				return err
			}
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return s.undoRecords(ctx, out, err)
	}
	return out, nil
}

// undoRecords discards records of a batch that failed: they were never
// sandboxes, so they leave no ledger session behind either.
func (s *Service) undoRecords(ctx context.Context, recs []*store.Sandbox, err error) ([]*store.Sandbox, error) {
	for _, r := range recs {
		// (An undo that tore a record down already leaves none to find.)
		if derr := s.cfg.Store.DiscardSandbox(context.WithoutCancel(ctx), r.ID); derr != nil && !errdefs.Is(derr, errdefs.KindNotFound) {
			s.cfg.Log.Warn("discard a record of a failed batch", "sandbox", r.ID, "err", derr)
		}
	}
	return nil, err
}
