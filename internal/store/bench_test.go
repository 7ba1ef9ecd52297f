package store

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
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
			ctx := context.Background()
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
