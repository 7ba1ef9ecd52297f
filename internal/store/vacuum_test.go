package store

import (
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fileBytes is the database's main file and its write-ahead log on disk.
func fileBytes(t *testing.T, path string) int64 {
	t.Helper()
	var n int64
	for _, p := range []string{path, path + "-wal"} {
		if st, err := os.Stat(p); err == nil {
			n += st.Size()
		}
	}
	return n
}

// fill writes events of about size bytes each to sb's session.
func fill(t *testing.T, s *Store, sb *Sandbox, events, size int) {
	t.Helper()
	arg := strings.Repeat("x", size)
	for range events {
		if err := s.AddEvent(own(), sb, &EventSpec{Type: "sandbox.exec_started", Data: map[string]any{"argv": []string{"sh", "-c", arg}}}); err != nil {
			t.Fatal(err)
		}
	}
}

// A database older than the switch (auto_vacuum NONE) is rewritten into
// INCREMENTAL at Open, keeping its rows; a new one starts in it.
func TestOpenSwitchesToIncremental(t *testing.T) {
	ctx := own()
	tests := []struct {
		name     string
		old      bool // made by plain SQLite first, in mode NONE, with rows
		rewrites bool
	}{
		{"new", false, false},
		{"old", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "shard.db")
			if tt.old {
				db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)")
				if err != nil {
					t.Fatal(err)
				}
				if _, err := db.ExecContext(ctx, schema+`INSERT INTO events(session, type, sandbox_id, at) VALUES('s', 't', 'x', '2025')`); err != nil {
					t.Fatal(err)
				}
				if mode, _ := pragmaInt(ctx, db, "auto_vacuum"); mode != 0 {
					t.Fatalf("the old database's mode = %d, want 0", mode)
				}
				db.Close()
			}
			s := openStore(t, path)
			took, err := s.Converted()
			if err != nil || (took > 0) != tt.rewrites {
				t.Fatalf("Converted() = %v, %v; want a rewrite: %v", took, err, tt.rewrites)
			}
			sp, err := s.Space(ctx)
			if err != nil || sp.Mode != autoVacuumIncremental {
				t.Fatalf("Space() = %+v, %v; want mode 2", sp, err)
			}
			if tt.old {
				if evs := events(t, s, "s"); len(evs) != 1 {
					t.Fatalf("events after the rewrite: %d, want 1", len(evs))
				}
			}
		})
	}
}

// A removed session's pages go back to the filesystem at Reclaim, in
// steps of any size; what stays is readable.
func TestReclaimAfterDeleteSession(t *testing.T) {
	ctx := own()
	for _, step := range []int{0, 7, 100000} {
		t.Run("step="+strconv.Itoa(step), func(t *testing.T) {
			s, path := newStore(t)
			big, small := sample("id1", "big"), sample("id2", "small")
			big.Session, small.Session = "big", "small"
			mustCreate(t, s, big, &EventSpec{Type: "sandbox.created"})
			mustCreate(t, s, small, &EventSpec{Type: "sandbox.created"})
			fill(t, s, big, 400, 16<<10) // ~6.4 MB
			fill(t, s, small, 10, 100)
			if err := s.DeleteSandbox(ctx, big.ID, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Reclaim(ctx, step); err != nil { // a checkpointed log first, for a fair "before"
				t.Fatal(err)
			}
			before := fileBytes(t, path)
			if err := s.DeleteSession(ctx, "big"); err != nil {
				t.Fatal(err)
			}
			sp, _ := s.Space(ctx)
			if sp.FreeBytes() < 6<<20 {
				t.Fatalf("free after the delete: %d bytes, want the session's ~6.4 MB", sp.FreeBytes())
			}
			freed, err := s.Reclaim(ctx, step)
			if err != nil || freed != sp.FreePages {
				t.Fatalf("Reclaim = %d, %v; want %d pages", freed, err, sp.FreePages)
			}
			after := fileBytes(t, path)
			if before-after < 6<<20 {
				t.Fatalf("file %d bytes before, %d after: want ~6.4 MB back", before, after)
			}
			if sp, _ := s.Space(ctx); sp.FreePages != 0 {
				t.Fatalf("free pages after Reclaim: %d", sp.FreePages)
			}
			if evs := events(t, s, "small"); len(evs) != 11 {
				t.Fatalf("the other session after Reclaim: %d events, want 11", len(evs))
			}
			if n, err := s.Reclaim(ctx, step); n != 0 || err != nil {
				t.Fatalf("a second Reclaim = %d, %v; want 0", n, err)
			}
		})
	}
}
