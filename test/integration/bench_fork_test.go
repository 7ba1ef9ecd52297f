package integration

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/internal/agent/host"
	"github.com/useshards/shard/internal/agent/proto"

	"github.com/useshards/shard/client"
)

// holderScript keeps N MiB resident (random, so no page is zero) and keeps
// the longest gap its own clock saw in /tmp/gap (ms); /tmp/reset starts a
// new measurement. That gap is the freeze as the process inside sees it.
const holderScript = `
import os, sys, time
blob = bytearray(os.urandom(int(sys.argv[1]) << 20))
open('/tmp/ready', 'w').close()
gap, last = 0.0, time.monotonic()
while True:
    time.sleep(0.001)
    now = time.monotonic()
    if now - last > gap:
        gap = now - last
        with open('/tmp/gap', 'w') as f:
            f.write('%.3f' % (gap * 1000))
    last = now
    if os.path.exists('/tmp/reset'):
        os.remove('/tmp/reset')
        gap = 0.0
        with open('/tmp/gap', 'w') as f:
            f.write('0')
`

func readGap(b *testing.B, id string) time.Duration {
	out := execOK(b, id, "cat", "/tmp/gap")
	ms, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
	if err != nil {
		b.Fatalf("gap %q: %v", out, err)
	}
	return time.Duration(ms * float64(time.Millisecond))
}

func resetGap(b *testing.B, id string) {
	execOK(b, id, "touch", "/tmp/reset")
	for i := 0; i < 100; i++ {
		if out := execOK(b, id, "sh", "-c", "test -e /tmp/reset && echo wait || cat /tmp/gap"); strings.TrimSpace(out) == "0" {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
}

// holder makes a sandbox whose process holds mib MiB resident and keeps
// its clock's longest gap (holderScript), and waits until it runs.
func holder(b *testing.B, mib int) *client.Sandbox {
	e := need(b)
	sb := create(b, client.CreateRequest{Image: python, Memory: []byte(fmt.Sprintf(`"%dMiB"`, 2*mib+512))})
	execOK(b, sb.ID, "sh", "-c", "cat > /tmp/holder.py <<'EOF'\n"+holderScript+"\nEOF\npython3 /tmp/holder.py "+strconv.Itoa(mib)+" >/dev/null 2>&1 &")
	for i := 0; ; i++ {
		if r, err := e.c.Exec(context.Background(), sb.ID, client.ExecRequest{Argv: []string{"test", "-e", "/tmp/gap"}}); err == nil && r.ExitCode == 0 {
			return sb
		}
		if i > 600 {
			b.Fatal("the holder did not start")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tokenOf(b *testing.B, id string) string {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(need(b).dataDir, "shard.db")+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	var doc string
	if err := db.QueryRow(`SELECT doc FROM sandboxes WHERE id = ?`, id).Scan(&doc); err != nil {
		b.Fatal(err)
	}
	_, after, _ := strings.Cut(doc, `"token":"`)
	tok, _, _ := strings.Cut(after, `"`)
	return tok
}

// BenchmarkFork measures, for a source whose process holds 16 MiB, 256 MiB
// and 1 GiB resident: the source's freeze as the process inside sees it (a
// gap in its own clock), and the time from the fork request until an exec
// in the fork returns; beside the raw flow by hand on the same source:
// `runsc checkpoint --leave-running`, `runsc restore` into a fresh netns,
// then the same exec through the restored agent. shard-* forks restore into
// sandboxes made ahead (--ahead; each timed fork starts once they are made
// again); then the same forks with the server restarted with --ahead 0
// (each fork creates its sandbox, shard-create-*), and with --ahead 0
// --fork-memory pages (the way before the memory handoff, shard-pages-*).
// 256MiB-count4 is four forks from one freeze, ready when an exec returned
// in each.
func BenchmarkFork(b *testing.B) {
	for _, mib := range []int{16, 256, 1024} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) { benchFork(b, mib, 1) })
	}
	b.Run("256MiB-count4", func(b *testing.B) { benchFork(b, 256, 4) })
}

// forkReady forks src count times from one freeze and waits for an exec in
// each; it returns the forks' ids.
func forkReady(b *testing.B, src string, count int) []string {
	e := need(b)
	ctx := context.Background()
	forks, err := e.c.ForkMany(ctx, src, client.ForkRequest{Count: count})
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, len(forks))
	errs := make(chan error, len(forks))
	for i, f := range forks {
		ids[i] = f.ID
		go func() {
			_, err := e.c.Exec(ctx, f.ID, client.ExecRequest{Argv: []string{"true"}})
			errs <- err
		}()
	}
	for range forks {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	return ids
}

// dropForks removes forks and src's checkpoints (a fork keeps its own:
// images must not pile up on the disk across iterations). It returns how
// the last checkpoint's memory went (handoff or pages).
func dropForks(b *testing.B, src string, forks []string) string {
	e := need(b)
	ctx := context.Background()
	for _, id := range forks {
		e.c.Remove(ctx, id, true)
	}
	mem := ""
	if cks, err := e.c.Checkpoints(ctx, src); err == nil {
		for _, ck := range cks {
			mem = ck.Memory
			if ck.MemoryNote != "" {
				mem += " (" + ck.MemoryNote + ")"
			}
			e.c.RemoveCheckpoint(ctx, ck.ID)
		}
	}
	return mem
}

func benchFork(b *testing.B, mib, count int) {
	e := need(b)
	ctx := context.Background()
	// Sandboxes made ahead (the server's default), as many as the fork
	// takes: the first fork makes the shape known, and each timed fork
	// starts once they are made again (a fork per task, tasks apart).
	restartWith(b, "--ahead", strconv.Itoa(max(2, count)))
	src := holder(b, mib)
	dropForks(b, src.ID, forkReady(b, src.ID, count))
	bundle, cleanup := rawBundle(b, src)
	b.Cleanup(cleanup)
	token := tokenOf(b, src.ID)
	runsc := func(args ...string) []string {
		return append([]string{"--root", filepath.Join(e.runDir, "runsc"), "--platform", "systrap", "--network", "sandbox", "--overlay2", "none"}, args...)
	}
	s := samples{}
	memory := ""
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// shard fork
		b.StopTimer()
		madeAhead(b, max(2, count))
		resetGap(b, src.ID)
		b.StartTimer()
		start := time.Now()
		forks := forkReady(b, src.ID, count)
		s.add("shard-fork-ready", time.Since(start))
		b.StopTimer()
		s.add("shard-freeze", readGap(b, src.ID))
		memory = dropForks(b, src.ID, forks)
		if count > 1 {
			b.StartTimer()
			continue
		}

		// raw runsc, by hand
		resetGap(b, src.ID)
		img := filepath.Join(e.dir, "rawimg")
		os.RemoveAll(img)
		os.MkdirAll(img, 0o700)
		netCleanup := rawNetns(b)
		rawID := fmt.Sprintf("rawfork%05d", i)
		b.StartTimer()
		start = time.Now()
		if out, err := exec.Command("runsc", runsc("checkpoint", "--leave-running", "--image-path", img, src.ID)...).CombinedOutput(); err != nil {
			b.Fatalf("raw checkpoint: %v %s", err, out)
		}
		ck := time.Since(start)
		// The restored container inherits runsc's stdio: a file, never a
		// pipe (a pipe would stay open for the container's life).
		logf, _ := os.Create(filepath.Join(e.dir, "rawrestore.log"))
		rc := exec.Command("runsc", runsc("restore", "--detach", "--image-path", img, "--bundle", bundle, rawID)...)
		rc.Stdout, rc.Stderr = logf, logf
		err := rc.Run()
		logf.Close()
		if err != nil {
			out, _ := os.ReadFile(filepath.Join(e.dir, "rawrestore.log"))
			b.Fatalf("raw restore: %v %s", err, out)
		}
		ac := &host.Client{Addr: "10.99.0.2:4951", Token: token}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		sess, err := ac.Exec(rctx, proto.Request{Argv: []string{"true"}})
		if err != nil {
			b.Fatalf("exec in the raw restore: %v", err)
		}
		for {
			typ, _, err := sess.Recv()
			if err != nil || typ == proto.FrameExit {
				break
			}
		}
		sess.Close()
		cancel()
		s.add("raw-fork-ready", time.Since(start))
		b.StopTimer()
		s.add("raw-checkpoint", ck)
		s.add("raw-freeze", readGap(b, src.ID))
		exec.Command("runsc", runsc("delete", "--force", rawID)...).Run()
		os.RemoveAll(img) // its page cache must not weigh on the next run
		netCleanup()
		b.StartTimer()
	}
	// The same forks the ways before, in this run: each fork creating its
	// sandbox (--ahead 0), and besides that loading its memory page by
	// page (the way before the memory handoff).
	for _, way := range []struct {
		name  string
		flags []string
	}{{"shard-create", []string{"--ahead", "0"}}, {"shard-pages", []string{"--ahead", "0", "--fork-memory", "pages"}}} {
		e.stopServer()
		if err := e.startServer(way.flags...); err != nil {
			b.Fatal(err)
		}
		for i := 0; i < b.N; i++ {
			resetGap(b, src.ID)
			start := time.Now()
			forks := forkReady(b, src.ID, count)
			s.add(way.name+"-fork-ready", time.Since(start))
			s.add(way.name+"-freeze", readGap(b, src.ID))
			dropForks(b, src.ID, forks)
		}
	}
	e.stopServer()
	if err := e.startServer(); err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "BENCH %s memory %s\n", b.Name(), memory)
	order := []string{"shard-freeze", "shard-create-freeze", "shard-pages-freeze", "raw-freeze", "raw-checkpoint", "shard-fork-ready", "shard-create-fork-ready", "shard-pages-fork-ready", "raw-fork-ready"}
	if count > 1 { // no raw flow by hand for several forks
		order = []string{"shard-freeze", "shard-create-freeze", "shard-pages-freeze", "shard-fork-ready", "shard-create-fork-ready", "shard-pages-fork-ready"}
	}
	report(b, s, "", order...)
	for _, k := range [][2]string{{"shard-freeze", "raw-freeze"}, {"shard-fork-ready", "raw-fork-ready"}, {"shard-fork-ready", "shard-create-fork-ready"}, {"shard-freeze", "shard-pages-freeze"}, {"shard-fork-ready", "shard-pages-fork-ready"}} {
		if d := pct(s[k[1]], 0.5); d > 0 {
			r := pct(s[k[0]], 0.5) / d
			b.ReportMetric(r, k[0]+"/"+k[1])
			fmt.Fprintf(os.Stderr, "BENCH %s %s / %s p50 ratio %.2fx\n", b.Name(), k[0], k[1], r)
		}
	}
}
