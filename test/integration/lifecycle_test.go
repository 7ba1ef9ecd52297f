package integration

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// TestLifecycle: create -> exec -> stop -> start -> exec -> remove, on each
// provider, with an image pulled from the local registry.
func TestLifecycle(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			ctx := ctxT(t)
			name := "life-" + prov
			out, errOut, code := e.cli(t, "", "create", "--name", name, "--memory", "256MiB", "--cpu", "0.5", "--provider", prov, busybox)
			if code != 0 {
				t.Fatalf("create: exit %d: %s", code, errOut)
			}
			id := strings.TrimSpace(out)
			if len(id) != 12 {
				t.Fatalf("create printed %q, want a 12-char id", out)
			}
			t.Cleanup(func() { e.c.Remove(context.Background(), id, true) })

			// Exit codes and stderr kept apart from stdout.
			out, errOut, code = e.cli(t, "", "exec", name, "sh", "-c", "echo to-out; echo to-err >&2; exit 7")
			if code != 7 || out != "to-out\n" || errOut != "to-err\n" {
				t.Fatalf("exec: code %d stdout %q stderr %q; want 7, %q, %q", code, out, errOut, "to-out\n", "to-err\n")
			}
			// Stdin forwarded.
			out, _, code = e.cli(t, "line one\nline two\n", "exec", id, "sh", "-c", "wc -l; cat >/dev/null")
			if code != 0 || strings.TrimSpace(out) != "2" {
				t.Fatalf("stdin: code %d out %q, want 2 lines counted", code, out)
			}
			// --env, --workdir, --user.
			out, _, code = e.cli(t, "", "exec", "--env", "GREETING=hi", "--workdir", "/tmp", "--user", "nobody", name,
				"sh", "-c", `echo "$GREETING $(pwd) $(id -u)"`)
			if code != 0 || out != "hi /tmp 65534\n" {
				t.Fatalf("env/workdir/user: code %d out %q", code, out)
			}
			// kubectl's "--" between the sandbox and the command.
			if out, errOut, code := e.cli(t, "", "exec", name, "--", "echo", "-n", "dashes"); code != 0 || out != "dashes" {
				t.Fatalf("exec SANDBOX -- COMMAND: code %d out %q err %q", code, out, errOut)
			}
			execOK(t, id, "sh", "-c", "echo kept > /root/file")
			if _, errOut, code = e.cli(t, "", "stop", name); code != 0 {
				t.Fatalf("stop: %s", errOut)
			}
			sb, err := e.c.Get(ctx, name)
			if err != nil || sb.State != "stopped" {
				t.Fatalf("after stop: %+v, %v", sb, err)
			}
			if _, errOut, code = e.cli(t, "", "start", name); code != 0 {
				t.Fatalf("start: %s", errOut)
			}
			if got := execOK(t, id, "cat", "/root/file"); got != "kept\n" {
				t.Fatalf("file after stop/start = %q, want %q", got, "kept\n")
			}
			if _, errOut, code = e.cli(t, "", "remove", name); code == 0 || !strings.Contains(errOut, "is running") {
				t.Fatalf("remove of a running sandbox without --force: code %d, %q", code, errOut)
			}
			if _, errOut, code = e.cli(t, "", "remove", "--force", name); code != 0 {
				t.Fatalf("remove --force: %s", errOut)
			}
			if _, err := e.c.Get(ctx, id); err == nil {
				t.Fatalf("sandbox still there after remove")
			}
			assertNoLeftovers(t, id)
		})
	}
}

// assertNoLeftovers checks every host piece of a sandbox is gone.
func assertNoLeftovers(t *testing.T, id string) {
	t.Helper()
	e := need(t)
	for _, p := range []string{
		filepath.Join(e.runDir, "netns", id),
		filepath.Join(e.dataDir, "run", id),
		filepath.Join(e.dataDir, "storage", "sandboxes", id+".img"),
		filepath.Join(e.dataDir, "storage", "mnt", id),
		"/sys/fs/cgroup/memory/shard/" + id,
	} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("leftover after remove: %s", p)
		}
	}
	for _, m := range mounts() {
		if strings.Contains(m.line, id) {
			t.Errorf("leftover mount of %s: %s", id, m.line)
		}
	}
	links, _ := run("ip", "-o", "link")
	if strings.Contains(links, "vs"+id) {
		t.Errorf("leftover veth for %s", id)
	}
}

// TestStdinAndStreaming: the API's stdin field, and output that arrives in
// pieces before the command ends.
func TestStdinAndStreaming(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox})
	in := base64.StdEncoding.EncodeToString([]byte("abc"))
	res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"cat"}, Stdin: &in})
	if err != nil || string(res.Stdout) != "abc" {
		t.Fatalf("stdin via API: %+v, %v", res, err)
	}
	// Streaming: the first line must arrive well before the command ends.
	pr := &firstWrite{at: make(chan time.Time, 1)}
	start := time.Now()
	res, err = e.c.ExecStream(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", "echo first; sleep 2; echo second"}}, pr, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("stream exec: %+v, %v", res, err)
	}
	first := <-pr.at
	if first.Sub(start) > 1500*time.Millisecond {
		t.Fatalf("first output came after %v: not streamed", first.Sub(start))
	}
}

type firstWrite struct {
	at   chan time.Time
	done bool
}

func (f *firstWrite) Write(p []byte) (int, error) {
	if !f.done {
		f.done = true
		f.at <- time.Now()
	}
	return len(p), nil
}

// TestTTY: an interactive terminal with a size, a resize, and input.
func TestTTY(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov})
			ctx := ctxT(t)
			sess, err := e.c.ExecInteractive(ctx, sb.ID, client.ExecRequest{Argv: []string{"sh"}, TTY: true, Rows: 30, Cols: 100})
			if err != nil {
				t.Fatal(err)
			}
			pr, pw := newPipe()
			var out strings.Builder
			done := make(chan *client.ExecResult, 1)
			go func() {
				res, err := sess.Run(ctx, pr, &out, nil)
				if err != nil {
					t.Error(err)
				}
				done <- res
			}()
			pw <- "tty; stty size\n"
			time.Sleep(500 * time.Millisecond)
			if err := sess.Resize(ctx, 40, 120); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
			pw <- "stty size; exit 5\n"
			var res *client.ExecResult
			select {
			case res = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("tty session did not end; output so far %q", out.String())
			}
			got := out.String()
			for _, want := range []string{"/dev/pts/", "30 100", "40 120"} {
				if !strings.Contains(got, want) {
					t.Errorf("tty output lacks %q:\n%s", want, got)
				}
			}
			if res == nil || res.ExitCode != 5 {
				t.Errorf("tty exit = %+v, want 5", res)
			}
		})
	}
}

// newPipe gives a reader fed by a channel of strings (a typist).
func newPipe() (*chanReader, chan<- string) {
	ch := make(chan string, 8)
	return &chanReader{ch: ch}, ch
}

type chanReader struct {
	ch  chan string
	buf string
}

func (r *chanReader) Read(p []byte) (int, error) {
	if r.buf == "" {
		r.buf = <-r.ch
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// TestExecUserHome: a command run as a user has that user's home from the
// sandbox's /etc/passwd (as podman gives it), not the root's HOME the
// runtime gave the agent; a HOME the sandbox was created with, or the exec
// sets, stays.
func TestExecUserHome(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			plain := create(t, client.CreateRequest{Image: busybox, Provider: prov})
			own := create(t, client.CreateRequest{Image: busybox, Provider: prov, Env: []byte(`["HOME=/work"]`)})
			nobodyHome := strings.TrimSpace(execOK(t, plain.ID, "sh", "-c", "grep '^nobody:' /etc/passwd | cut -d: -f6"))
			if nobodyHome == "" || nobodyHome == "/root" {
				t.Fatalf("nobody's home in the image's /etc/passwd is %q: pick a user whose home is not root's", nobodyHome)
			}
			tests := []struct {
				sb         *client.Sandbox
				user, home string
				env        []string
				want       string
			}{
				{sb: plain, user: "nobody", want: nobodyHome},
				{sb: plain, user: "65534", want: nobodyHome},
				{sb: plain, user: "4242", want: "/"},
				{sb: plain, user: "", want: "/root"},
				{sb: plain, user: "nobody", env: []string{"HOME=/tmp"}, want: "/tmp"},
				{sb: own, user: "nobody", want: "/work"},
				{sb: own, user: "", want: "/work"},
			}
			for _, tt := range tests {
				args := []string{"exec"}
				if tt.user != "" {
					args = append(args, "--user", tt.user)
				}
				for _, kv := range tt.env {
					args = append(args, "--env", kv)
				}
				args = append(args, tt.sb.ID, "sh", "-c", `echo "$HOME"`)
				out, errOut, code := e.cli(t, "", args...)
				if code != 0 || out != tt.want+"\n" {
					t.Errorf("shard %s: exit %d, %q (stderr %q); want HOME %q", strings.Join(args, " "), code, out, errOut, tt.want)
				}
			}
		})
	}
}

// TestExecUserPasswdEdges: a sandbox's own /etc/passwd and /etc/group at
// their edges. A home with a NUL is none (it was "start sh: invalid
// argument"); a user past a line over 64KiB is found (it was "not in
// /etc/passwd"); a user in more groups than the kernel takes runs with
// the first 65536 (it was "start id: invalid argument"); and without
// /etc/passwd root's home is /root (it was /).
func TestExecUserPasswdEdges(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov})
			execOK(t, sb.ID, "sh", "-c", `set -e
cp /etc/passwd /etc/passwd.orig
{ cat /etc/passwd.orig
  printf 'nul:x:1002:1002::/a\000b:/bin/sh\nmany:x:1003:1003::/many:/bin/sh\n'
  head -c 70000 /dev/zero | tr '\0' x; echo
  echo 'late:x:1001:1001::/late:/bin/sh'; } > /etc/passwd
seq 3000 69000 | awk '{print "g" $1 ":x:" $1 ":many"}' >> /etc/group
mkdir -p /late /many`)
			// many's groups, as the kernel holds them: the first 65536; and
			// its home. Not through sh: busybox's sh in 65536 groups takes
			// minutes.
			out, errOut, code := e.cli(t, "", "exec", "--user", "many", sb.ID, "grep", "^Groups:", "/proc/self/status")
			if n := len(strings.Fields(out)) - 1; code != 0 || n != 65536 {
				t.Errorf("exec --user many: %d groups (exit %d, stderr %q); want 65536", n, code, errOut)
			}
			if out, errOut, code := e.cli(t, "", "exec", "--user", "many", sb.ID, "env"); code != 0 || !strings.Contains(out, "\nHOME=/many\n") && !strings.HasPrefix(out, "HOME=/many\n") {
				t.Errorf("exec --user many env: exit %d, %q (stderr %q); want HOME=/many", code, out, errOut)
			}
			tests := []struct {
				user, script, want string
				pre                string // run (as root) before
			}{
				{user: "nul", script: `echo "$HOME"`, want: "/"},
				{user: "late", script: `echo "$HOME"`, want: "/late"},
				{user: "", script: `echo "$HOME"`, want: "/root", pre: "rm /etc/passwd"},
				{user: "0", script: `echo "$HOME"`, want: "/root"},
			}
			for _, tt := range tests {
				if tt.pre != "" {
					execOK(t, sb.ID, "sh", "-c", tt.pre)
				}
				args := []string{"exec"}
				if tt.user != "" {
					args = append(args, "--user", tt.user)
				}
				args = append(args, sb.ID, "sh", "-c", tt.script)
				out, errOut, code := e.cli(t, "", args...)
				if code != 0 || out != tt.want+"\n" {
					t.Errorf("shard %s: exit %d, %q (stderr %q); want %q", strings.Join(args, " "), code, out, errOut, tt.want)
				}
			}
		})
	}
}
