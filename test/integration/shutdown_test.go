package integration

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/useshards/shard/client"
)

// drain is what a shutdown under load did: how long the server took to
// exit after SIGTERM, and how many goroutines it reported left behind.
type drain struct {
	exit     time.Duration
	left     int
	wsClose  []string // each WebSocket exec's close reason
	streamed []error  // each HTTP exec stream's end
	forkErr  error    // the fork in flight's answer
	fork     string   // its name
}

// shutdownUnderLoad stops the server with SIGTERM while sandboxes run,
// three exec streams print (two WebSocket, one HTTP stream) and a fork is
// in flight, and returns what it saw. The server is started again after.
func shutdownUnderLoad(t testing.TB, sbs []*client.Sandbox) drain {
	e := need(t)
	ctx := ctxT(t)
	loop := []string{"sh", "-c", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done"}
	var d drain
	var wg sync.WaitGroup
	var mu sync.Mutex
	started := make(chan struct{}, 3)
	for i := range 2 {
		ws := wsDial(t, ctx, sbs[i%len(sbs)].ID, client.ExecRequest{Argv: loop, Interactive: true})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				_, msg, err := ws.Read(ctx)
				if n == 1 {
					started <- struct{}{} // started, and output flows
				}
				if err != nil {
					mu.Lock()
					d.wsClose = append(d.wsClose, websocket.CloseStatus(err).String()+": "+closeReason(err))
					mu.Unlock()
					return
				}
				_ = msg
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		w := &startedWriter{ch: started}
		_, err := e.c.ExecStream(ctx, sbs[0].ID, client.ExecRequest{Argv: loop}, w, io.Discard)
		mu.Lock()
		d.streamed = append(d.streamed, err)
		mu.Unlock()
	}()
	for range 3 {
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the exec streams did not start")
		}
	}
	// A fork in flight: the signal comes while it runs.
	d.fork = "drain-fork-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)
	forked := make(chan struct{})
	go func() {
		defer close(forked)
		_, d.forkErr = e.c.Fork(ctx, sbs[0].ID, client.ForkRequest{Name: d.fork})
	}()
	time.Sleep(150 * time.Millisecond)
	logFrom := fileSize(e.serveLog)
	t0 := time.Now()
	e.server.Process.Signal(syscall.SIGTERM)
	exited := make(chan error, 1)
	go func() { exited <- e.server.Wait() }()
	select {
	case <-exited:
		d.exit = time.Since(t0)
	case <-time.After(60 * time.Second):
		e.server.Process.Kill()
		<-exited
		t.Fatal("shard serve did not exit within 60s of SIGTERM")
	}
	<-forked
	wg.Wait()
	d.left = goroutinesLeft(t, e.serveLog, logFrom)
	if err := e.startServer(); err != nil {
		t.Fatal(err)
	}
	return d
}

// startedWriter signals ch at its first write.
type startedWriter struct {
	once sync.Once
	ch   chan struct{}
}

func (w *startedWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { w.ch <- struct{}{} })
	return len(p), nil
}

func closeReason(err error) string {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return ce.Reason
	}
	return err.Error()
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

var leftRE = regexp.MustCompile(`msg=stopped goroutines_left=(\d+)`)

// goroutinesLeft reads what the server reported at its exit, in its log
// past from.
func goroutinesLeft(t testing.TB, log string, from int64) int {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	tail := string(b[min(from, int64(len(b))):])
	m := leftRE.FindAllStringSubmatch(tail, -1)
	if m == nil {
		t.Fatalf("the server's log says nothing of goroutines left at its exit:\n%s", lastLines(tail, 40))
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	if n > 0 {
		t.Logf("goroutines left:\n%s", lastLines(tail, 200))
	}
	return n
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestShutdownDrains: SIGTERM with sandboxes running, exec streams printing
// and a fork in flight: the server exits promptly, leaves no goroutine
// behind, tells each stream why it ended, and on the next start every
// sandbox runs on with its files and processes, the fork is whole or
// absent, and no runtime container is left that no record owns.
func TestShutdownDrains(t *testing.T) {
	e := need(t)
	var sbs []*client.Sandbox
	for _, p := range providers {
		sb := create(t, client.CreateRequest{Image: busybox, Provider: p, Name: "drain-" + p})
		execOK(t, sb.ID, "sh", "-c", "echo kept > /root/f; sleep 1000 >/dev/null 2>&1 &")
		sbs = append(sbs, sb)
	}
	d := shutdownUnderLoad(t, sbs)
	t.Logf("exit %v after SIGTERM, goroutines left %d, fork: %v", d.exit, d.left, d.forkErr)
	if d.left != 0 {
		t.Errorf("%d goroutines left at the exit, want 0", d.left)
	}
	const why = "the server is shutting down; the command runs on in the sandbox (its end is not recorded)"
	if len(d.wsClose) != 2 {
		t.Errorf("WebSocket ends %q, want 2", d.wsClose)
	}
	for _, c := range d.wsClose {
		if !strings.Contains(c, "StatusGoingAway") || !strings.Contains(c, why) {
			t.Errorf("a WebSocket exec ended with %q, want going away: %s", c, why)
		}
	}
	if len(d.streamed) != 1 || d.streamed[0] == nil || !strings.Contains(d.streamed[0].Error(), why) {
		t.Errorf("the HTTP exec stream ended with %v, want: %s", d.streamed, why)
	}
	ctx := ctxT(t)
	for _, sb := range sbs {
		got, err := e.c.Get(ctx, sb.ID)
		if err != nil || got.State != "running" {
			t.Fatalf("%s after the restart: %+v, %v", sb.Name, got, err)
		}
		if out := execOK(t, sb.ID, "cat", "/root/f"); out != "kept\n" {
			t.Errorf("%s: file after the restart %q", sb.Name, out)
		}
		if out := execOK(t, sb.ID, "sh", "-c", "pidof sleep >/dev/null && echo yes; ps | grep -c 'tick' || true"); !strings.HasPrefix(out, "yes\n") {
			t.Errorf("%s: the processes from before the shutdown are gone: %q", sb.Name, out)
		}
	}
	// The fork is whole (answered, running) or absent (refused), never
	// half made.
	fk, err := e.c.Get(ctx, d.fork)
	switch {
	case d.forkErr == nil && (err != nil || fk.State != "running"):
		t.Errorf("the fork answered but after the restart is %+v, %v", fk, err)
	case d.forkErr != nil && err == nil:
		t.Errorf("the fork was refused (%v) but a sandbox of its name exists: %+v", d.forkErr, fk)
	}
	if d.forkErr == nil {
		if out := execOK(t, d.fork, "cat", "/root/f"); out != "kept\n" {
			t.Errorf("the fork's file %q", out)
		}
		e.c.Remove(ctx, d.fork, true)
	}
	checkNoOrphans(t)
}

// checkNoOrphans fails if a runtime holds a container that no sandbox
// record owns.
func checkNoOrphans(t testing.TB) {
	t.Helper()
	e := need(t)
	all, err := e.c.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range all {
		ids = append(ids, sb.ID)
	}
	for _, rt := range []string{"runsc", "runc"} {
		for _, id := range runtimeIDs(rt, filepath.Join(e.runDir, rt)) {
			if !slices.Contains(ids, id) {
				t.Errorf("%s holds container %s, which no sandbox record owns", rt, id)
			}
		}
	}
}

// BenchmarkShutdown: the time from SIGTERM to exit of a server holding 20
// running sandboxes, with 3 exec streams and a fork in flight; reported
// with the goroutines left (goal 0).
func BenchmarkShutdown(b *testing.B) {
	e := need(b)
	var sbs []*client.Sandbox
	for i := range 20 {
		sbs = append(sbs, create(b, client.CreateRequest{Image: busybox, Name: "drain-bench-" + strconv.Itoa(i), Memory: jsonRaw("64MiB")}))
	}
	var exits []time.Duration
	left := 0
	for b.Loop() {
		d := shutdownUnderLoad(b, sbs)
		exits = append(exits, d.exit)
		left = max(left, d.left)
		if d.forkErr == nil {
			e.c.Remove(context.Background(), d.fork, true)
		}
	}
	slices.Sort(exits)
	b.ReportMetric(float64(exits[len(exits)/2].Milliseconds()), "exit-p50-ms")
	b.ReportMetric(float64(exits[len(exits)*9/10].Milliseconds()), "exit-p90-ms")
	b.ReportMetric(float64(left), "goroutines-left")
}
