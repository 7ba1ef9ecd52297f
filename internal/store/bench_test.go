package store

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkAppend measures ledger appends as the server makes them: one
// event per transaction, committed to disk (synchronous FULL) before it
// returns, on the disk the test's temp dir is on (set TMPDIR to measure
// another). It reports events per second and the p50/p99 of one append,
// alone and with 8 writers at once.
//
// auto_vacuum=none is the database as shard made it before it gave space
// back (rewritten here into that mode), incremental as it is now: the cost
// of the mode on every append (pointer-map pages kept up to date).
func BenchmarkAppend(b *testing.B) {
	for _, mode := range []string{"none", "incremental"} {
		for _, writers := range []int{1, 8} {
			b.Run(fmt.Sprintf("auto_vacuum=%s/writers=%d", mode, writers), func(b *testing.B) { benchAppend(b, mode, writers) })
		}
	}
}

func benchAppend(b *testing.B, mode string, writers int) {
	{
		{
			ctx := own()
			s, err := Open(ctx, filepath.Join(b.TempDir(), "bench.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if mode == "none" {
				if _, err := s.db.ExecContext(ctx, `PRAGMA auto_vacuum = NONE; VACUUM`); err != nil {
					b.Fatal(err)
				}
			}
			sb := &Sandbox{ID: "bench", Name: "bench", Session: "bench"}
			if err := s.CreateSandbox(ctx, sb, nil); err != nil {
				b.Fatal(err)
			}
			data := map[string]any{"exec": "0123456789abcdef", "argv": []string{"pip", "install", "requests"}, "cwd": "/root"}
			lat := make([][]time.Duration, writers)
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; i < b.N; i += writers {
						t := time.Now()
						if err := s.AddEvent(ctx, sb, &EventSpec{Type: "sandbox.exec_started", Data: data}); err != nil {
							b.Error(err)
							return
						}
						lat[w] = append(lat[w], time.Since(t))
					}
				}()
			}
			wg.Wait()
			el := time.Since(start)
			b.StopTimer()
			all := slices.Concat(lat...)
			slices.Sort(all)
			if len(all) == 0 {
				return
			}
			at := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))].Microseconds()) / 1000 }
			b.ReportMetric(float64(len(all))/el.Seconds(), "events/s")
			b.ReportMetric(at(0.5), "p50-ms")
			b.ReportMetric(at(0.9), "p90-ms")
			b.ReportMetric(at(0.99), "p99-ms")
		}
	}
}

// BenchmarkConvert measures Open's one-time switch of a database made
// before auto_vacuum=INCREMENTAL (SHARD_BENCH_DB_MB of events, default 500)
// into the mode: a VACUUM, a rewrite of the whole file.
func BenchmarkConvert(b *testing.B) {
	mb := 500
	if v, err := strconv.Atoi(os.Getenv("SHARD_BENCH_DB_MB")); err == nil {
		mb = v
	}
	ctx := own()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		path := filepath.Join(b.TempDir(), "old.db")
		s, err := Open(ctx, path)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.db.ExecContext(ctx, `PRAGMA auto_vacuum = NONE; VACUUM`); err != nil {
			b.Fatal(err)
		}
		arg := strings.Repeat("x", 120<<10)
		// Many rows per transaction: the figure is the rewrite's, not this.
		for n := 0; n < mb<<20; {
			tx, err := s.db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			for range 64 {
				if _, err := tx.ExecContext(ctx, `INSERT INTO events(project, session, type, sandbox_id, at, data) VALUES('default','s','sandbox.exec_started','x','2025',?)`, arg); err != nil {
					b.Fatal(err)
				}
				n += len(arg)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}
		s.Close()
		st, _ := os.Stat(path)
		b.StartTimer()
		s, err = Open(ctx, path)
		if err != nil {
			b.Fatal(err)
		}
		took, cerr := s.Converted()
		b.StopTimer()
		sp, _ := s.Space(ctx)
		s.Close()
		if cerr != nil || took == 0 || sp.Mode != autoVacuumIncremental {
			b.Fatalf("Converted() = %v, %v; mode %d", took, cerr, sp.Mode)
		}
		b.ReportMetric(float64(st.Size())/(1<<20), "db-MiB")
		b.ReportMetric(float64(took.Milliseconds()), "vacuum-ms")
	}
}
