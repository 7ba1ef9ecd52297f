package store

import (
	"context"
	"database/sql"
)

// addrIndex is every project's sandboxes' addresses, kept beside the table
// so that a create does not read every record to pick a free address and
// count the server's sandboxes (it did: every create decoded them all).
// It is filled from the table when the store opens and changed after each
// committed insert, update and delete of a sandbox, the only writes of
// that table; one server owns its database.
type addrIndex struct {
	byID  map[string]string // sandbox id → its address
	inUse map[string]int    // address → how many sandboxes hold it
}

func (x *addrIndex) load(ctx context.Context, db *sql.DB) error {
	x.byID, x.inUse = map[string]string{}, map[string]int{}
	all, err := list[Sandbox](ctx, db, "sandboxes") // unscoped: every project's
	if err != nil {
		return err
	}
	for _, sb := range all {
		x.set(sb.ID, sb.IP)
	}
	return nil
}

func (x *addrIndex) set(id, ip string) {
	x.drop(id)
	x.byID[id] = ip
	if ip != "" {
		x.inUse[ip]++
	}
}

func (x *addrIndex) drop(id string) {
	ip, ok := x.byID[id]
	if !ok {
		return
	}
	delete(x.byID, id)
	if ip == "" {
		return
	}
	if x.inUse[ip]--; x.inUse[ip] <= 0 {
		delete(x.inUse, ip)
	}
}

// SandboxCount is how many sandboxes the server holds, in every project,
// whoever asks (the server's limit is the server's).
func (s *Store) SandboxCount() int {
	s.addrMu.Lock()
	defer s.addrMu.Unlock()
	return len(s.addrs.byID)
}

// AddrInUse reports whether a sandbox of any project has address ip.
func (s *Store) AddrInUse(ip string) bool {
	s.addrMu.Lock()
	defer s.addrMu.Unlock()
	return s.addrs.inUse[ip] > 0
}

func (s *Store) indexAddr(id, ip string) {
	s.addrMu.Lock()
	s.addrs.set(id, ip)
	s.addrMu.Unlock()
}

func (s *Store) unindexAddr(id string) {
	s.addrMu.Lock()
	s.addrs.drop(id)
	s.addrMu.Unlock()
}
