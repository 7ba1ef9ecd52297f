package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// BenchmarkLedgerReclaim measures what shard ledger rm gives back: a
// session grown to SHARD_BENCH_LEDGER_MB (default 500) by execs with large
// arguments is removed, and the database file is watched until it shrank.
// It reports the bytes given back, the rm's answer time, the time until the
// file shrank, and the p50/p90 of an exec (true, small argv, in another
// sandbox) before the rm and while the space goes back (the reclaim's
// steps share the database's one connection with every request).
func BenchmarkLedgerReclaim(b *testing.B) {
	e := need(b)
	mb, _ := strconv.Atoi(envOr("SHARD_BENCH_LEDGER_MB", "500"))
	probe := create(b, client.CreateRequest{Image: busybox, Provider: "runc", Name: "bench-reclaim-probe"})
	s := samples{}
	execOnce := func(k string) {
		start := time.Now()
		if _, err := e.c.Exec(context.Background(), probe.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		s.add(k, time.Since(start))
	}
	for i := 0; i < b.N; i++ {
		sb := create(b, client.CreateRequest{Image: busybox, Provider: "runc", Name: fmt.Sprintf("bench-reclaim-%d", i)})
		grew := time.Now()
		growLedger(b, sb, int64(mb)<<20)
		growTook := time.Since(grew)
		if err := e.c.Remove(ctxT(b), sb.ID, true); err != nil {
			b.Fatal(err)
		}
		time.Sleep(2 * time.Second) // the remove's own reclaim pass (a few pages) is over
		for range 100 {
			execOnce("exec-idle")
		}
		full := dbBytes(e)
		var done atomic.Bool
		during := make(chan struct{})
		go func() {
			defer close(during)
			for !done.Load() {
				execOnce("exec-during-reclaim")
			}
		}()
		start := time.Now()
		if err := e.c.RemoveSession(ctxT(b), sb.Session); err != nil {
			b.Fatal(err)
		}
		rmTook := time.Since(start)
		took := reclaimed(b, e, full-int64(mb)<<20*3/4, 10*time.Minute)
		// Then until the file stops shrinking (the last steps, the log's
		// truncation).
		after := dbBytes(e)
		for {
			time.Sleep(500 * time.Millisecond)
			n := dbBytes(e)
			if n >= after {
				break
			}
			after, took = n, time.Since(start)-rmTook
		}
		done.Store(true)
		<-during
		b.ReportMetric(float64(full-after)/(1<<20), "returned-MiB")
		b.ReportMetric(float64(rmTook.Milliseconds()), "rm-ms")
		b.ReportMetric(float64(took.Milliseconds()), "shrunk-ms")
		fmt.Fprintf(os.Stderr, "BENCH %s session %d MiB (grown in %s): database %d -> %d bytes (%.0f MiB back); ledger rm answered in %s, file shrunk %s after it\n",
			b.Name(), mb, growTook.Round(time.Millisecond), full, after, float64(full-after)/(1<<20), rmTook.Round(time.Millisecond), took.Round(time.Millisecond))
	}
	report(b, s, "exec-idle", "exec-idle", "exec-during-reclaim")
}
