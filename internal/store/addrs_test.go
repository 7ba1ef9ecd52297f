package store

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/project"
)

// TestAddrIndex: the addresses and count the store keeps beside the table
// follow every project's creates, failed creates, updates and deletes, and
// come back from the table when the store is opened again (a restart).
func TestAddrIndex(t *testing.T) {
	s, path := newStore(t)
	a, b := project.With(own(), "team-a"), project.With(own(), "team-b")
	mk := func(ctx context.Context, id, name, ip string) {
		t.Helper()
		sb := sample(id, name)
		sb.IP = ip
		if err := s.CreateSandbox(ctx, sb, nil); err != nil {
			t.Fatal(err)
		}
	}
	check := func(s *Store, n int, in, out []string) {
		t.Helper()
		if got := s.SandboxCount(); got != n {
			t.Errorf("SandboxCount = %d, want %d", got, n)
		}
		for _, ip := range in {
			if !s.AddrInUse(ip) {
				t.Errorf("AddrInUse(%s) = false, want true", ip)
			}
		}
		for _, ip := range out {
			if s.AddrInUse(ip) {
				t.Errorf("AddrInUse(%s) = true, want false", ip)
			}
		}
	}
	check(s, 0, nil, []string{"10.88.0.2"})
	mk(a, "id1", "one", "10.88.0.2")
	mk(b, "id2", "one", "10.88.0.3") // another project, the same name
	mk(own(), "id3", "three", "10.88.0.4")
	check(s, 3, []string{"10.88.0.2", "10.88.0.3", "10.88.0.4"}, []string{"10.88.0.5"})

	// A create that fails (a taken name, a taken id) holds nothing.
	dup := sample("id4", "one")
	dup.IP = "10.88.0.5"
	if err := s.CreateSandbox(a, dup, nil); err == nil {
		t.Fatal("a second sandbox named one in team-a was made")
	}
	dup = sample("id1", "other")
	dup.IP = "10.88.0.6"
	if err := s.CreateSandbox(a, dup, nil); err == nil {
		t.Fatal("a second sandbox id1 was made")
	}
	check(s, 3, []string{"10.88.0.2"}, []string{"10.88.0.5", "10.88.0.6"})

	// Updates (one that fails too) keep the address.
	if _, err := s.UpdateSandbox(a, "id1", func(r *Sandbox) (*EventSpec, error) { r.State = "running"; return nil, nil }); err != nil {
		t.Fatal(err)
	}
	s.UpdateSandbox(a, "id1", func(r *Sandbox) (*EventSpec, error) { r.IP = "10.88.0.9"; return nil, errors.New("no") })
	check(s, 3, []string{"10.88.0.2"}, []string{"10.88.0.9"})

	// A delete from another project finds nothing and frees nothing.
	s.DeleteSandbox(b, "id1", nil)
	check(s, 3, []string{"10.88.0.2"}, nil)
	if err := s.DeleteSandbox(a, "id1", nil); err != nil {
		t.Fatal(err)
	}
	check(s, 2, []string{"10.88.0.3", "10.88.0.4"}, []string{"10.88.0.2"})

	// Opened again: from the table.
	s.Close()
	s2 := openStore(t, path)
	check(s2, 2, []string{"10.88.0.3", "10.88.0.4"}, []string{"10.88.0.2"})
}

// TestLookupsUseIndexes: the server's own lookup of a sandbox by id or name
// (unscoped) and the checkpoints of a session, scoped or not, search an
// index instead of reading every row.
func TestLookupsUseIndexes(t *testing.T) {
	s, _ := newStore(t)
	for _, q := range []string{
		`SELECT project, doc FROM sandboxes WHERE (id = ?1 OR name = ?1) LIMIT 2`,
		`SELECT project, doc FROM sandboxes WHERE (id = ?1 OR name = ?1) AND project = ? LIMIT 2`,
		`SELECT project, doc FROM checkpoints WHERE 1 AND project = ? AND session = ?`,
		`SELECT project, doc FROM checkpoints WHERE 1 AND session = ?`,
	} {
		rows, err := s.db.Query(`EXPLAIN QUERY PLAN `+q, "x", "y")
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		for _, p := range plan {
			if strings.HasPrefix(p, "SCAN") {
				t.Errorf("%s: reads every row: %v", q, plan)
			}
		}
	}
}
