package integration

import (
	"bufio"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// contractApp is a program that, like many, seeds a userspace random
// generator once (Python's random, seed 42) and holds a TCP connection (one
// the host opened to it). On SIGUSR1 it reseeds from the kernel's pool: the
// on-fork hook sends it. Each /srv/go makes it draw three numbers and use
// the connection, and write what it saw to /srv/out.json.
const contractApp = `
import json, os, random, signal, socket, time
random.seed(42)
signal.signal(signal.SIGUSR1, lambda *_: random.seed(os.urandom(16)))
open('/srv/app.pid', 'w').write(str(os.getpid()))
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(('0.0.0.0', 7000))
ls.listen(1)
open('/srv/ready', 'w').close()
c, _ = ls.accept()
while True:
    while not os.path.exists('/srv/go'):
        time.sleep(0.02)
    os.remove('/srv/go')
    nums = [random.random() for _ in range(3)]
    try:
        c.sendall(b'x\n')
        conn = 'ok' if c.recv(10) else 'eof'
    except ConnectionResetError:
        conn = 'reset'
    except Exception as e:
        conn = 'error ' + type(e).__name__
    with open('/srv/out.tmp', 'w') as f:
        json.dump({'nums': nums, 'conn': conn}, f)
    os.rename('/srv/out.tmp', '/srv/out.json')
`

type contractOut struct {
	Nums []float64 `json:"nums"`
	Conn string    `json:"conn"`
}

// draw has sb's app draw its numbers and use its connection once.
func draw(t *testing.T, sb string) contractOut {
	t.Helper()
	execOK(t, sb, "sh", "-c", "rm -f /srv/out.json && touch /srv/go")
	for i := 0; i < 200; i++ {
		res, err := need(t).c.Exec(ctxT(t), sb, client.ExecRequest{Argv: []string{"cat", "/srv/out.json"}})
		if err == nil && res.ExitCode == 0 {
			var o contractOut
			if err := json.Unmarshal(res.Stdout, &o); err != nil {
				t.Fatalf("%s: out.json %q: %v", sb, res.Stdout, err)
			}
			return o
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: the app did not answer", sb)
	return contractOut{}
}

type identity struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	ParentID   string `json:"parent_id"`
	ParentName string `json:"parent_name"`
	Checkpoint string `json:"checkpoint"`
	Generation int    `json:"generation"`
}

func identityOf(t *testing.T, sb string) identity {
	t.Helper()
	var id identity
	out := execOK(t, sb, "cat", "/run/shard/fork")
	if err := json.Unmarshal([]byte(out), &id); err != nil {
		t.Fatalf("%s: /run/shard/fork %q: %v", sb, out, err)
	}
	return id
}

// TestForkContract (gvisor): a fork has its own host name, machine-id and
// /run/shard/fork; a random generator seeded before the fork draws the
// same numbers in the source and a fork without hooks, and different ones
// in two forks whose on-fork hook reseeds it; a TCP connection open in the
// source goes on there and is reset in the forks; the hook's run is in the
// fork's ledger. A failing hook (or one past its timeout) refuses the fork
// and leaves nothing; with hook_errors=ignore the fork is made and the
// failure recorded; with hooks_in_source the source runs them too.
func TestForkContract(t *testing.T) {
	e := need(t)
	src := create(t, client.CreateRequest{Image: python, Name: "contract-src", Memory: jsonRaw("512MiB")})
	writeOK(t, src.ID, "/etc/machine-id", []byte("00112233445566778899aabbccddeeff\n"), nil)
	writeOK(t, src.ID, "/srv/app.py", []byte(contractApp), &client.WriteFileOptions{Parents: true})
	execOK(t, src.ID, "sh", "-c", "nohup python3 /srv/app.py >/srv/app.log 2>&1 &")
	for i := 0; ; i++ {
		if r, err := e.c.Exec(ctxT(t), src.ID, client.ExecRequest{Argv: []string{"test", "-e", "/srv/ready"}}); err == nil && r.ExitCode == 0 {
			break
		}
		if i > 200 {
			t.Fatal("the app did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The host's end of the connection echoes what it gets, for as long
	// as the test runs.
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(src.IP, "7000"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	go func() {
		r := bufio.NewReader(conn)
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			conn.Write(line)
		}
	}()
	if id := identityOf(t, src.ID); id.ID != src.ID || id.Name != src.Name || id.Generation != 0 {
		t.Fatalf("the source's /run/shard/fork: %+v", id)
	}

	// A fork without hooks shares the generator's state.
	plain, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{Name: "contract-plain"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(ctxT(t), plain.ID, true) })
	s1, p1 := draw(t, src.ID), draw(t, plain.ID)
	if !equalNums(s1.Nums, p1.Nums) {
		t.Fatalf("without a hook the fork drew %v, the source %v: the test shows nothing", p1.Nums, s1.Nums)
	}
	if s1.Conn != "ok" || p1.Conn != "reset" {
		t.Fatalf("the connection: %q in the source, %q in the fork; want ok and reset", s1.Conn, p1.Conn)
	}

	// Two forks whose hook reseeds.
	execOK(t, src.ID, "sh", "-c", "mkdir -p /etc/shard/on-fork.d && printf '#!/bin/sh\\necho reseeding $SHARD_FORK_NAME gen $SHARD_FORK_GENERATION\\nkill -USR1 $(cat /srv/app.pid)\\n' > /etc/shard/on-fork.d/10-reseed && chmod +x /etc/shard/on-fork.d/10-reseed")
	forks, err := e.c.ForkMany(ctxT(t), src.ID, client.ForkRequest{Name: "contract", Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		t.Cleanup(func() { e.c.Remove(ctxT(t), f.ID, true) })
	}
	s2 := draw(t, src.ID)
	a, b := draw(t, forks[0].ID), draw(t, forks[1].ID)
	if equalNums(a.Nums, b.Nums) || equalNums(a.Nums, s2.Nums) || equalNums(b.Nums, s2.Nums) {
		t.Fatalf("after the reseeding hook: source %v, forks %v and %v: want all different", s2.Nums, a.Nums, b.Nums)
	}
	if s2.Conn != "ok" || a.Conn != "reset" || b.Conn != "reset" {
		t.Fatalf("the connection: source %q, forks %q %q; want ok, reset, reset", s2.Conn, a.Conn, b.Conn)
	}
	machineIDs := map[string]bool{}
	for _, sb := range []*client.Sandbox{src, &forks[0], &forks[1]} {
		machineIDs[execOK(t, sb.ID, "cat", "/etc/machine-id")] = true
		if h := strings.TrimSpace(execOK(t, sb.ID, "hostname")); h != sb.Name {
			t.Errorf("%s: hostname %q", sb.Name, h)
		}
	}
	if len(machineIDs) != 3 {
		t.Errorf("machine-ids: %v, want three different", machineIDs)
	}
	id := identityOf(t, forks[0].ID)
	if id.ID != forks[0].ID || id.Name != forks[0].Name || id.ParentID != src.ID || id.ParentName != src.Name || id.Generation != 1 || id.Checkpoint == "" {
		t.Fatalf("the fork's /run/shard/fork: %+v", id)
	}
	hooks := hookEvents(t, forks[0].Session)
	if len(hooks) != 1 || hooks[0]["exit_code"] != 0.0 || !strings.Contains(hooks[0]["output"].(string), "reseeding "+forks[0].Name+" gen 1") {
		t.Fatalf("the fork's ledger has hook runs %v", hooks)
	}
	// A fork of a fork is generation 2.
	g2, err := e.c.Fork(ctxT(t), forks[0].ID, client.ForkRequest{Name: "contract-g2"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(ctxT(t), g2.ID, true) })
	if id := identityOf(t, g2.ID); id.Generation != 2 || id.ParentID != forks[0].ID {
		t.Fatalf("a fork of a fork: %+v", id)
	}

	// A failing hook refuses the fork and leaves nothing.
	execOK(t, src.ID, "sh", "-c", "printf '#!/bin/sh\\necho cannot get a lease >&2\\nexit 3\\n' > /etc/shard/on-fork.d/20-lease && chmod +x /etc/shard/on-fork.d/20-lease")
	before, _ := e.c.List(ctxT(t))
	_, err = e.c.Fork(ctxT(t), src.ID, client.ForkRequest{Name: "contract-fail"})
	wantCode(t, "a fork whose hook fails", err, 422, "fork_hook_failed", "20-lease")
	if !strings.Contains(err.Error(), "exit code 3") || !strings.Contains(err.Error(), "cannot get a lease") {
		t.Errorf("the refusal says %q", err)
	}
	after, _ := e.c.List(ctxT(t))
	if len(after) != len(before) {
		t.Fatalf("%d sandboxes after the refused fork, %d before", len(after), len(before))
	}
	if _, err := e.c.Get(ctxT(t), "contract-fail"); err == nil {
		t.Fatal("the refused fork is there")
	}
	execOK(t, src.ID, "true")
	// Ignored, the fork is made and the failure is in its ledger; the
	// source ran its hooks too.
	kept, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{Name: "contract-kept", HookErrors: "ignore", HooksInSource: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(ctxT(t), kept.ID, true) })
	if hs := hookEvents(t, kept.Session); len(hs) != 2 || hs[1]["exit_code"] != 3.0 || hs[1]["hook"] != "20-lease" {
		t.Fatalf("the kept fork's hook runs: %v", hs)
	}
	var inSource bool
	for _, h := range hookEvents(t, src.Session) {
		inSource = inSource || h["role"] == "source"
	}
	if !inSource {
		t.Fatal("the source's ledger has no hook run of role source")
	}
	// A hook past its timeout.
	execOK(t, src.ID, "sh", "-c", "rm /etc/shard/on-fork.d/20-lease && printf '#!/bin/sh\\nsleep 30\\n' > /etc/shard/on-fork.d/30-slow && chmod +x /etc/shard/on-fork.d/30-slow")
	_, err = e.c.Fork(ctxT(t), src.ID, client.ForkRequest{Name: "contract-slow", HookTimeout: "1s"})
	wantCode(t, "a fork whose hook runs past its timeout", err, 422, "fork_hook_failed", "timeout")
	_, err = e.c.Fork(ctxT(t), src.ID, client.ForkRequest{Name: "contract-bad", HookErrors: "maybe"})
	wantCode(t, "a bad hook_errors", err, 400, "invalid_argument", "hook_errors")
}

func equalNums(a, b []float64) bool {
	if len(a) != len(b) || len(a) == 0 {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// hookEvents are the data of a session's sandbox.fork_hook events.
func hookEvents(t *testing.T, session string) []map[string]any {
	t.Helper()
	page, err := need(t).c.Events(ctxT(t), session, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, ev := range page.Events {
		if ev.Type == "sandbox.fork_hook" {
			var d map[string]any
			json.Unmarshal(ev.Data, &d)
			out = append(out, d)
		}
	}
	return out
}
