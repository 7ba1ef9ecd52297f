package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// Giving space back. The database runs with auto_vacuum=INCREMENTAL: the
// pages a deletion frees (a removed ledger session's events, mostly) go to
// SQLite's free list, and Reclaim moves them to the end of the file and cuts
// it off there, a bounded step at a time, so the file shrinks by what was
// deleted while requests go on between the steps. Without it (SQLite's
// default, and every database shard made before) the file never shrank:
// freed pages were only reused by later writes.

// autoVacuumIncremental is PRAGMA auto_vacuum's value for INCREMENTAL.
const autoVacuumIncremental = 2

// ReclaimStep is how many free pages one step of Reclaim gives back
// (4 MiB at SQLite's 4 KiB pages): each step holds the database's one
// connection, so a request waits at most one step behind a reclaim.
const ReclaimStep = 1024

// ensureIncremental puts db in auto_vacuum=INCREMENTAL. A new database
// takes the mode as it is; one already written in another mode needs a
// VACUUM, a rewrite of the whole file (it needs as much free disk again,
// for a while), done here once. It returns how long that rewrite took (0:
// none was needed).
func ensureIncremental(ctx context.Context, db *sql.DB) (time.Duration, error) {
	mode, err := pragmaInt(ctx, db, "auto_vacuum")
	if err != nil {
		return 0, err
	}
	if mode == autoVacuumIncremental {
		return 0, nil
	}
	if _, err := db.ExecContext(ctx, `PRAGMA auto_vacuum = INCREMENTAL`); err != nil {
		return 0, err
	}
	if mode, err = pragmaInt(ctx, db, "auto_vacuum"); err != nil || mode == autoVacuumIncremental {
		return 0, err // an empty database: the mode is set
	}
	// WAL mode has written a header already: even a new database takes a
	// VACUUM (of nothing, a millisecond), which is no rewrite to report.
	tables, err := pragmaInt(ctx, db, "schema_version")
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if _, err := db.ExecContext(ctx, `VACUUM`); err != nil {
		return 0, fmt.Errorf("switch to auto_vacuum=INCREMENTAL (VACUUM): %w", err)
	}
	if tables == 0 {
		return 0, nil
	}
	return time.Since(start), nil
}

func pragmaInt(ctx context.Context, db *sql.DB, name string) (int64, error) {
	var v int64
	err := db.QueryRowContext(ctx, `PRAGMA `+name).Scan(&v)
	return v, err
}

// Converted is how long Open's switch of an older database to
// auto_vacuum=INCREMENTAL took (0: it was not needed), and why it failed if
// it did (the database then works as before, without giving space back).
func (s *Store) Converted() (time.Duration, error) { return s.converted, s.convertErr }

// FileSpace is the database file's pages: what it holds, and what a
// Reclaim would give back to the filesystem.
type FileSpace struct {
	PageSize  int64 // bytes
	Pages     int64 // the main file's pages (the write-ahead log apart)
	FreePages int64 // pages on the free list: Reclaim returns them
	Mode      int64 // auto_vacuum: 0 none, 1 full, 2 incremental
}

// Bytes is the main file's size.
func (f FileSpace) Bytes() int64 { return f.Pages * f.PageSize }

// FreeBytes is what Reclaim would give back.
func (f FileSpace) FreeBytes() int64 { return f.FreePages * f.PageSize }

// Space reads the database file's page counts.
func (s *Store) Space(ctx context.Context) (FileSpace, error) {
	var f FileSpace
	for _, p := range []struct {
		name string
		v    *int64
	}{{"page_size", &f.PageSize}, {"page_count", &f.Pages}, {"freelist_count", &f.FreePages}, {"auto_vacuum", &f.Mode}} {
		v, err := pragmaInt(ctx, s.db, p.name)
		if err != nil {
			return f, err
		}
		*p.v = v
	}
	return f, nil
}

// Reclaim gives the database's free pages back to the filesystem, step
// pages at a time (ReclaimStep if step <= 0), until none are left or ctx
// ends, then empties the write-ahead log into the file and truncates it
// (where the file's cut-off takes effect, in WAL mode). Between steps the
// connection is free for requests. It returns the pages freed. A database
// not in INCREMENTAL mode (its switch failed at Open) frees none.
func (s *Store) Reclaim(ctx context.Context, step int) (int64, error) {
	if step <= 0 {
		step = ReclaimStep
	}
	var freed int64
	for {
		before, err := pragmaInt(ctx, s.db, "freelist_count")
		if err != nil {
			return freed, err
		}
		if before == 0 {
			break
		}
		if _, err := s.db.ExecContext(ctx, fmt.Sprintf(`PRAGMA incremental_vacuum(%d)`, step)); err != nil {
			return freed, err
		}
		after, err := pragmaInt(ctx, s.db, "freelist_count")
		if err != nil {
			return freed, err
		}
		if after >= before {
			break // not INCREMENTAL: nothing moves
		}
		freed += before - after
		if ctx.Err() != nil {
			return freed, ctx.Err()
		}
	}
	if freed > 0 {
		// busy and log-size answers do not matter: a later checkpoint
		// (SQLite's own, every 1000 pages) finishes the job.
		if _, err := s.db.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
			return freed, err
		}
	}
	return freed, nil
}
