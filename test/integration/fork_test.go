package integration

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/sandbox"
	_ "modernc.org/sqlite"
)

// counterScript keeps a counter only in memory and appends each value to a
// file: after a fork, the file and the memory must come from one instant,
// so each copy's file counts on with no gap and no repeat.
const counterScript = `i=0; while true; do i=$((i+1)); echo $i >> /tmp/count; sleep 0.01; done`

func checkCounting(t *testing.T, who, id string) int {
	t.Helper()
	out := execOK(t, id, "cat", "/tmp/count")
	lines := strings.Fields(out)
	for k, l := range lines {
		n, err := strconv.Atoi(l)
		if err != nil || n != k+1 {
			t.Fatalf("%s: line %d of its count is %q, want %d (a gap or a repeat)", who, k+1, l, k+1)
		}
	}
	return len(lines)
}

// TestForkMemoryAndFiles: the memory-continuity and three-way file checks.
func TestForkMemoryAndFiles(t *testing.T) {
	e := need(t)
	mem := jsonRaw("256MiB")
	cpu := jsonRaw("0.5")
	disk := jsonRaw("1GiB")
	src := create(t, client.CreateRequest{Image: busybox, Name: "fork-src", Memory: mem, CPU: cpu, Disk: disk, Pids: 300})
	execOK(t, src.ID, "sh", "-c", "echo before > /root/before")
	execOK(t, src.ID, "sh", "-c", counterScript+" >/dev/null 2>&1 &")
	time.Sleep(500 * time.Millisecond)

	a, err := e.c.Fork(ctxT(t), "fork-src", client.ForkRequest{Name: "fork-a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), a.ID, true) })
	b, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{Name: "fork-b"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), b.ID, true) })

	// New id, name and address; the source's bounds.
	for _, f := range []*client.Sandbox{a, b} {
		if f.ID == src.ID || f.IP == src.IP || f.IP == "" || f.State != "running" || f.ParentID != src.ID {
			t.Fatalf("fork %+v vs source %+v", f, src)
		}
		if f.MemoryBytes != src.MemoryBytes || f.CPU != src.CPU || f.DiskBytes != src.DiskBytes || f.Pids != src.Pids {
			t.Fatalf("fork bounds %d/%g/%d/%d, source %d/%g/%d/%d", f.MemoryBytes, f.CPU, f.DiskBytes, f.Pids,
				src.MemoryBytes, src.CPU, src.DiskBytes, src.Pids)
		}
	}
	if a.IP == b.IP || a.Name != "fork-a" || b.Name != "fork-b" {
		t.Fatalf("forks share an address or lack their names: %+v %+v", a, b)
	}
	// Bounds as seen from inside: memory total, disk size; and the host
	// cgroups the runtime applied.
	inside := func(id string) string {
		return execOK(t, id, "sh", "-c", "grep MemTotal /proc/meminfo; df -k / | tail -1 | awk '{print $2}'; ip -4 -o addr show eth0 2>/dev/null | awk '{print $4}'")
	}
	srcIn := strings.Fields(inside(src.ID))
	for _, f := range []*client.Sandbox{a, b} {
		fIn := strings.Fields(inside(f.ID))
		if len(fIn) < 4 || len(srcIn) < 4 || fIn[1] != srcIn[1] || fIn[3] != srcIn[3] {
			t.Fatalf("inside the fork %v, inside the source %v: memory and disk must match", fIn, srcIn)
		}
		if len(fIn) >= 5 && !strings.HasPrefix(fIn[4], f.IP+"/") {
			t.Errorf("fork %s sees address %s, want %s", f.Name, fIn[4], f.IP)
		}
		for _, file := range []string{"memory/shard/%s/memory.limit_in_bytes", "cpu/shard/%s/cpu.cfs_quota_us", "pids/shard/%s/pids.max"} {
			want := readTrim(t, "/sys/fs/cgroup/"+fmt.Sprintf(file, src.ID))
			if got := readTrim(t, "/sys/fs/cgroup/"+fmt.Sprintf(file, f.ID)); got != want {
				t.Errorf("%s of fork %s = %s, source has %s", file, f.Name, got, want)
			}
		}
	}

	// Memory continuity: all three keep counting, each from the fork's value.
	time.Sleep(500 * time.Millisecond)
	ns := checkCounting(t, "source", src.ID)
	na := checkCounting(t, "fork-a", a.ID)
	nb := checkCounting(t, "fork-b", b.ID)
	time.Sleep(300 * time.Millisecond)
	if checkCounting(t, "source", src.ID) <= ns || checkCounting(t, "fork-a", a.ID) <= na || checkCounting(t, "fork-b", b.ID) <= nb {
		t.Fatalf("a counter stopped after the fork")
	}
	// The counting process is the same process, continued: same pid.
	pid := func(id string) string {
		return strings.TrimSpace(execOK(t, id, "sh", "-c", "ps -o pid,args | grep 'i=0' | grep -v grep | awk '{print $1}' | head -1"))
	}
	if ps, pa := pid(src.ID), pid(a.ID); ps == "" || pa != ps {
		t.Errorf("the counter runs as pid %q in the fork, %q in the source: want the same process", pa, ps)
	}

	// Files: before the fork in all; after, in one only.
	for _, id := range []string{src.ID, a.ID, b.ID} {
		if got := execOK(t, id, "cat", "/root/before"); got != "before\n" {
			t.Fatalf("file from before the fork in %s: %q", id, got)
		}
	}
	execOK(t, src.ID, "sh", "-c", "echo s > /root/after-src")
	execOK(t, a.ID, "sh", "-c", "echo a > /root/after-a; echo changed > /root/before")
	execOK(t, b.ID, "sh", "-c", "echo b > /root/after-b")
	want := map[string]string{src.ID: "after-src before", a.ID: "after-a before", b.ID: "after-b before"}
	for id, w := range want {
		if got := strings.Join(strings.Fields(execOK(t, id, "ls", "/root")), " "); got != w {
			t.Errorf("files in %s: %q, want %q", id, got, w)
		}
	}
	if got := execOK(t, src.ID, "cat", "/root/before"); got != "before\n" {
		t.Errorf("a fork's change reached the source: %q", got)
	}
	// Stopping the source does not touch the forks.
	if _, err := e.c.Stop(ctxT(t), src.ID); err != nil {
		t.Fatal(err)
	}
	if got := execOK(t, a.ID, "cat", "/root/before"); got != "changed\n" {
		t.Errorf("fork after the source stopped: %q", got)
	}
}

// TestForkErrors: every refusal, with its code and the seed's exact text.
func TestForkErrors(t *testing.T) {
	e := need(t)
	stopped := create(t, client.CreateRequest{Image: busybox, Name: "fork-stopped"})
	if _, err := e.c.Stop(ctxT(t), stopped.ID); err != nil {
		t.Fatal(err)
	}
	create(t, client.CreateRequest{Image: busybox, Name: "fork-runc", Provider: "runc"})
	create(t, client.CreateRequest{Image: busybox, Name: "fork-running"})
	before := sandboxFiles(t)
	tests := []struct {
		src, body  string
		status     int
		code, text string
	}{
		{"fork-stopped", `{"name":"x1"}`, 409, "sandbox_not_running", "sandbox fork-stopped is stopped: fork takes a running sandbox"},
		{"fork-runc", `{"name":"x2"}`, 409, "unsupported", "provider runc does not support fork on this host"},
		{"fork-running", `{"name":"fork-runc"}`, 409, "name_taken", "a sandbox named fork-runc already exists: pick another name, or remove that sandbox first"},
		{"nosuch", `{}`, 404, "sandbox_not_found", "sandbox nosuch not found"},
		{"fork-running", `{"name":"bad name"}`, 400, "invalid_argument", "not valid"},
		{"fork-running", `{"count":1000}`, 400, "invalid_argument", "count"},
		{"fork-running", `{"nme":"x"}`, 400, "invalid_argument", "unknown field"},
	}
	hc := unixHTTP(e.socket)
	for _, tt := range tests {
		resp, err := hc.Post("http://shard/v0/sandboxes/"+tt.src+"/fork", "application/json", strings.NewReader(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		var got struct{ Code, Message string }
		json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if resp.StatusCode != tt.status || got.Code != tt.code || got.Message != tt.text && !(tt.status == 400 && strings.Contains(got.Message, tt.text)) {
			t.Errorf("fork %s %s: %d %s %q; want %d %s %q", tt.src, tt.body, resp.StatusCode, got.Code, got.Message, tt.status, tt.code, tt.text)
		}
	}
	// The CLI prints the same message and exits non-zero.
	_, errOut, code := e.cli(t, "", "fork", "fork-stopped")
	if code == 0 || !strings.Contains(errOut, "sandbox fork-stopped is stopped: fork takes a running sandbox") {
		t.Errorf("cli fork of a stopped sandbox: %d %q", code, errOut)
	}
	if after := sandboxFiles(t); after != before {
		t.Errorf("a refused fork left files behind:\nbefore %s\nafter  %s", before, after)
	}
}

// TestForkFrozenExec: an exec that starts during the freeze is refused with
// its own code and the seed's text; an exec already running keeps its stream.
func TestForkFrozenExec(t *testing.T) {
	e := need(t)
	mem := jsonRaw("1GiB")
	src := create(t, client.CreateRequest{Image: python, Name: "frozen-src", Memory: mem})
	// Enough resident memory that the freeze lasts a while.
	execOK(t, src.ID, "sh", "-c", `python3 -c "import os,time; b=bytearray(os.urandom(256<<20)); open('/tmp/ready','w').close(); time.sleep(100000)" >/dev/null 2>&1 &`)
	for i := 0; ; i++ {
		if _, err := e.c.Exec(ctxT(t), src.ID, client.ExecRequest{Argv: []string{"test", "-e", "/tmp/ready"}}); err == nil {
			if r, _ := e.c.Exec(ctxT(t), src.ID, client.ExecRequest{Argv: []string{"test", "-e", "/tmp/ready"}}); r != nil && r.ExitCode == 0 {
				break
			}
		}
		if i > 300 {
			t.Fatal("the memory holder did not start")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A long exec streaming through the fork.
	var streamed strings.Builder
	streamDone := make(chan error, 1)
	go func() {
		res, err := e.c.ExecStream(ctxT(t), src.ID, client.ExecRequest{Argv: []string{"sh", "-c", "for i in $(seq 1 30); do echo $i; sleep 0.1; done"}}, &streamed, nil)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("exit %d", res.ExitCode)
		}
		streamDone <- err
	}()
	time.Sleep(300 * time.Millisecond)
	// Hammer exec while the fork runs, from several clients: an exec that
	// started just before the freeze waits it out, the others must be
	// refused.
	stop := make(chan struct{})
	refused := make(chan string, 100000)
	var wg sync.WaitGroup
	for h := 0; h < 8; h++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				// A short deadline: an exec that slipped in just before the
				// freeze waits it out; give up on it and try again.
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				_, err := e.c.Exec(ctx, src.ID, client.ExecRequest{Argv: []string{"true"}})
				cancel()
				if ce, ok := err.(*client.Error); ok && ce.Status == 409 {
					refused <- ce.Code + "|" + ce.Message
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	f, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{Name: "frozen-fork"})
	close(stop)
	wg.Wait()
	close(refused)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), f.ID, true) })
	n := 0
	for r := range refused {
		code, msg, _ := strings.Cut(r, "|")
		if code != "sandbox_frozen" || !strings.HasSuffix(msg, sandbox.FrozenMessage) {
			t.Errorf("refused exec: %s %q; want sandbox_frozen ending with %q", code, msg, sandbox.FrozenMessage)
		}
		n++
	}
	if n == 0 {
		t.Errorf("no exec was refused during the freeze")
	}
	if err := <-streamDone; err != nil {
		t.Fatalf("the exec running through the fork lost its stream: %v", err)
	}
	if got := strings.Fields(streamed.String()); len(got) != 30 || got[29] != "30" {
		t.Fatalf("the exec running through the fork streamed %v", got)
	}
	execOK(t, f.ID, "test", "-e", "/tmp/ready")
}

// TestForkOfForkAndConcurrent: a fork of a fork, several forks of one source
// at once, and --count from one freeze.
func TestForkOfForkAndConcurrent(t *testing.T) {
	e := need(t)
	src := create(t, client.CreateRequest{Image: busybox, Name: "conc-src"})
	execOK(t, src.ID, "sh", "-c", "echo gen0 > /root/gen")
	f1, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{Name: "conc-f1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), f1.ID, true) })
	execOK(t, f1.ID, "sh", "-c", "echo gen1 > /root/gen")
	f2, err := e.c.Fork(ctxT(t), f1.ID, client.ForkRequest{Name: "conc-f2"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), f2.ID, true) })
	if got := execOK(t, f2.ID, "cat", "/root/gen"); got != "gen1\n" {
		t.Fatalf("fork of a fork: %q", got)
	}
	var wg sync.WaitGroup
	ids := make([]string, 4)
	errs := make([]error, 4)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{})
			errs[i] = err
			if err == nil {
				ids[i] = f.ID
			}
		}()
	}
	wg.Wait()
	for i, id := range ids {
		if errs[i] != nil {
			t.Fatalf("concurrent fork %d: %v", i, errs[i])
		}
		t.Cleanup(func() { e.c.Remove(context.Background(), id, true) })
		if got := execOK(t, id, "cat", "/root/gen"); got != "gen0\n" {
			t.Fatalf("concurrent fork %d: %q", i, got)
		}
	}
	out, errOut, code := e.cli(t, "", "fork", "--count", "3", "--name", "conc-n", "conc-src")
	if code != 0 {
		t.Fatalf("fork --count 3: %s", errOut)
	}
	got := strings.Fields(out)
	if len(got) != 3 {
		t.Fatalf("fork --count 3 printed %q", out)
	}
	for i, id := range got {
		t.Cleanup(func() { e.c.Remove(context.Background(), id, true) })
		sb, err := e.c.Get(ctxT(t), fmt.Sprintf("conc-n-%d", i+1))
		if err != nil || sb.ID != id || sb.State != "running" {
			t.Fatalf("fork %d of --count: %+v %v", i+1, sb, err)
		}
	}
}

// TestForkLedger: the checkpoint event (with its tag) in the source's
// session, and the fork's own session named fork-<parentName>-<shortId>.
func TestForkLedger(t *testing.T) {
	e := need(t)
	src := create(t, client.CreateRequest{Image: busybox, Name: "ledger-src"})
	f, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{Name: "ledger-fork", Tag: "after-install"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), f.ID, true) })
	if want := "fork-ledger-src-" + f.ID[:6]; f.Session != want {
		t.Errorf("fork session %q, want %q", f.Session, want)
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(e.dataDir, "shard.db")+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var data string
	err = db.QueryRow(`SELECT data FROM events WHERE session = ? AND type = 'sandbox.checkpoint_created' ORDER BY seq DESC LIMIT 1`, "ledger-src").Scan(&data)
	if err != nil || !strings.Contains(data, `"tag":"after-install"`) || !strings.Contains(data, `"checkpoint"`) {
		t.Errorf("checkpoint event in the source's session: %q, %v", data, err)
	}
	var n int
	db.QueryRow(`SELECT count(*) FROM events WHERE session = ? AND type = 'sandbox.created'`, f.Session).Scan(&n)
	if n != 1 {
		t.Errorf("the fork's session %s has %d created events", f.Session, n)
	}
}

// TestForkFreezeTimeout: a freeze past the limit fails the fork, thaws the
// source, and leaves no fork behind (a server started with a tiny limit).
func TestForkFreezeTimeout(t *testing.T) {
	e := need(t)
	src := create(t, client.CreateRequest{Image: busybox, Name: "freeze-src"})
	execOK(t, src.ID, "sh", "-c", counterScript+" >/dev/null 2>&1 &")
	restartWith(t, "--fork-freeze-timeout", "5ms")
	before := sandboxFiles(t)
	_, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{Name: "freeze-fork"})
	ce, ok := err.(*client.Error)
	if !ok || ce.Code != "freeze_timeout" || !strings.Contains(ce.Message, "thawed") {
		t.Fatalf("fork past the freeze limit: %v", err)
	}
	sb, err := e.c.Get(ctxT(t), src.ID)
	if err != nil || sb.State != "running" {
		t.Fatalf("source after a timed-out freeze: %+v %v", sb, err)
	}
	n := checkCounting(t, "source", src.ID)
	time.Sleep(200 * time.Millisecond)
	if checkCounting(t, "source", src.ID) <= n {
		t.Fatalf("the source did not thaw")
	}
	if _, err := e.c.Get(ctxT(t), "freeze-fork"); err == nil {
		t.Fatalf("a half-made fork was left behind")
	}
	if after := sandboxFiles(t); after != before {
		t.Errorf("files left behind:\nbefore %s\nafter  %s", before, after)
	}
}

// TestSandboxLimit: each fork holds a slot of its own against the server's
// limit on sandboxes (N forks of one source need N+1 slots).
func TestSandboxLimit(t *testing.T) {
	e := need(t)
	all, err := e.c.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	limit := len(all) + 2
	restartWith(t, "--max-sandboxes", strconv.Itoa(limit))
	src := create(t, client.CreateRequest{Image: busybox, Name: "limit-src"})
	if _, err := e.c.ForkMany(ctxT(t), src.ID, client.ForkRequest{Count: 2, Name: "limit-many"}); err == nil {
		t.Fatalf("two forks with one slot left succeeded")
	} else if ce, ok := err.(*client.Error); !ok || ce.Code != "sandbox_limit" || ce.Status != 409 {
		t.Fatalf("two forks with one slot left: %v", err)
	}
	f, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{Name: "limit-fork"})
	if err != nil {
		t.Fatalf("a fork into the last slot: %v", err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), f.ID, true) })
	_, err = e.c.Fork(ctxT(t), src.ID, client.ForkRequest{})
	if ce, ok := err.(*client.Error); !ok || ce.Code != "sandbox_limit" {
		t.Fatalf("a fork past the limit: %v", err)
	}
	after, _ := e.c.List(ctxT(t))
	if len(after) != limit {
		t.Fatalf("%d sandboxes after the refusals, want %d", len(after), limit)
	}
}
