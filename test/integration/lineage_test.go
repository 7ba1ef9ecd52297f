package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/agent/proto"
)

// forkPair makes a python sandbox that reaches the test's package index,
// and two forks of it; each fork pip installs a different package.
func forkPair(t testing.TB, prefix string) (base *client.Sandbox, a, b client.Sandbox) {
	e := need(t)
	index := startPackageIndex(t)
	base = create(t, client.CreateRequest{Image: python, Name: prefix + "-base", Env: jsonRaw2(map[string]string{"PIP_INDEX_URL": index})})
	execOK(t, base.ID, "sh", "-c", "mkdir -p /app && printf 'print(1)\\n' > /app/main.py && echo base > /app/notes")
	forks, err := e.c.ForkMany(ctxT(t), base.ID, client.ForkRequest{Name: prefix, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		t.Cleanup(func() { e.c.Remove(context.Background(), f.ID, true) })
	}
	execOK(t, forks[0].ID, "pip", "install", "--quiet", "requests==2.31.0")
	execOK(t, forks[1].ID, "pip", "install", "--quiet", "numpy")
	execOK(t, forks[1].ID, "sh", "-c", "printf 'print(2)\\n' > /app/main.py && rm /app/notes && chmod 600 /app/main.py")
	return base, forks[0], forks[1]
}

func changesOf(d *client.Diff) map[string]client.Change {
	m := map[string]client.Change{}
	for _, c := range d.Changes {
		m[c.Path] = c
	}
	return m
}

// TestDiff: two forks that pip installed different packages: the diff from
// one to the other has one's package removed and the other's added, the
// edited file changed with its mode and a text patch, the removed file; a
// fork against its fork point has only what it did; a stopped fork the
// same; the CLI prints it; another image's sandbox is refused.
func TestDiff(t *testing.T) {
	e := need(t)
	_, a, b := forkPair(t, "diff")
	d, err := e.c.Diff(ctxT(t), b.ID, a.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	ch := changesOf(d)
	site := strings.TrimSpace(execOK(t, a.ID, "python3", "-c", "import os, requests; print(os.path.dirname(requests.__path__[0]))")) + "/"
	if c := ch[site+"requests"]; c.Kind != "removed" || c.Type != "dir" {
		t.Errorf("requests: %+v", c)
	}
	if c := ch[site+"numpy/__init__.py"]; c.Kind != "added" {
		t.Errorf("numpy/__init__.py: %+v", c)
	}
	if c := ch["/app/main.py"]; c.Kind != "changed" || strings.Join(c.What, ",") != "content,mode" || !strings.Contains(c.Patch, "-print(1)\n+print(2)") {
		t.Errorf("/app/main.py: %+v", c)
	}
	if c := ch["/app/notes"]; c.Kind != "removed" {
		t.Errorf("/app/notes: %+v", c)
	}
	for p := range ch {
		if strings.HasPrefix(p, "/run/shard") || strings.HasPrefix(p, "/.shard") || strings.HasPrefix(p, "/etc/host") {
			t.Errorf("a path the server puts in every sandbox: %s", p)
		}
		if strings.HasPrefix(p, "/usr/bin") || strings.HasPrefix(p, "/usr/lib/x86_64") {
			t.Errorf("a path neither fork touched: %s", p)
		}
	}
	if d.From.Name != a.Name || d.To.Name != b.Name {
		t.Errorf("sides: %+v → %+v", d.From, d.To)
	}
	// Against its fork point: requests and pip's own files, nothing of b's.
	own, err := e.c.Diff(ctxT(t), a.ID, "", false)
	if err != nil {
		t.Fatal(err)
	}
	oc := changesOf(own)
	if own.From.Kind != "checkpoint" || oc[site+"requests"].Kind != "added" || oc["/app/main.py"].Kind != "" || oc[site+"numpy"].Kind != "" {
		t.Fatalf("a since its fork point (%+v): %d changes, requests %+v", own.From, len(own.Changes), oc[site+"requests"])
	}
	if c, ok := oc[proto.ForkFile]; ok {
		t.Errorf("a since its fork point: its fork file, as the server wrote it, is listed: %+v", c)
	}
	// Stopped: the same.
	if _, err := e.c.Stop(ctxT(t), a.ID); err != nil {
		t.Fatal(err)
	}
	stopped, err := e.c.Diff(ctxT(t), a.ID, "", false)
	if err != nil || len(stopped.Changes) != len(own.Changes) {
		t.Fatalf("stopped: %d changes (%v), running %d", len(stopped.Changes), err, len(own.Changes))
	}
	out, errOut, code := e.cli(t, "", "diff", a.Name, b.Name)
	if code != 0 || !strings.Contains(out, "- "+site+"requests") || !strings.Contains(out, "M /app/main.py") {
		t.Fatalf("shard diff: exit %d: %s\n%s", code, errOut, out)
	}
	out, _, code = e.cli(t, "", "diff", "--stat", a.Name, b.Name)
	if code != 0 || !strings.Contains(out, "added") {
		t.Fatalf("shard diff --stat: %s", out)
	}
	other := create(t, client.CreateRequest{Image: busybox, Name: "diff-other"})
	_, err = e.c.Diff(ctxT(t), other.ID, a.ID, false)
	wantCode(t, "a diff across images", err, 400, "different_images", "one image")
}

// TestDiffPatchApplies: a fork edits, adds and removes files whose names
// have a space, a tab, a quote and a non-ASCII letter, and edits files of
// CRLF lines, a form feed and ESC sequences; what shard diff --stat
// --patch prints to a pipe (the counts, a blank line, the patches, the
// files' bytes as they are), applied by GNU patch -p1 and by git apply to
// a copy of the source's files, gives the fork's, byte for byte.
func TestDiffPatchApplies(t *testing.T) {
	e := need(t)
	base := create(t, client.CreateRequest{Image: busybox, Name: "patch-base"})
	execOK(t, base.ID, "sh", "-c", `mkdir -p /app && cd /app && printf '1\n' > 'my file' && printf 'q\n' > "$(printf 'tab\tq"')" &&
		printf 'c\n' > "$(printf 'caf\303\251')" && printf 'gone\n' > 'rm me' && printf 'p\n' > plain &&
		printf 'one\r\ntwo\r\n' > crlf && printf 'page\f1\n' > ff && printf '\033[31mred\033[0m\n' > esc`)
	fork, err := e.c.Fork(ctxT(t), base.ID, client.ForkRequest{Name: "patch-fork"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), fork.ID, true) })
	execOK(t, fork.ID, "sh", "-c", `cd /app && printf '2\n' > 'my file' && printf 'Q\n' > "$(printf 'tab\tq"')" &&
		printf 'C\n' > "$(printf 'caf\303\251')" && rm 'rm me' && printf 'new\n' > 'new file' &&
		printf 'one\r\nTWO\r\n' > crlf && printf 'page\f2\n' > ff && printf '\033[32mgreen\033[0m\n' > esc`)
	patch, errOut, code := e.cli(t, "", "diff", "--stat", "--patch", fork.Name)
	if code != 0 || !strings.Contains(patch, "1 added, 1 removed, 6 changed") || !strings.Contains(patch, " less)\n\n--- ") {
		t.Fatalf("shard diff --stat --patch: exit %d %s\n%s", code, errOut, patch)
	}
	want := t.TempDir()
	if _, errOut, code := e.cli(t, "", "cp", fork.Name+":/app", want); code != 0 {
		t.Fatalf("shard cp: %s", errOut)
	}
	for _, tool := range [][]string{{"patch", "-p1", "--batch"}, {"git", "apply"}} {
		dir := t.TempDir()
		if _, errOut, code := e.cli(t, "", "cp", base.Name+":/app", dir); code != 0 {
			t.Fatalf("shard cp: %s", errOut)
		}
		cmd := exec.Command(tool[0], tool[1:]...)
		cmd.Dir, cmd.Stdin = dir, strings.NewReader(patch)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s\nthe patch:\n%s", tool[0], err, out, patch)
		}
		if out, err := exec.Command("diff", "-r", filepath.Join(dir, "app"), filepath.Join(want, "app")).CombinedOutput(); err != nil {
			t.Errorf("%s did not make the fork's files: %v\n%s\nthe patch:\n%s", tool[0], err, out, patch)
		}
	}
}

// TestDiffShowsFilesBesideTheServers: a file a sandbox keeps under
// /run/shard (written inside) or /.shard (copied in while it is stopped,
// where its running self cannot see it) is in its diff, stopped and
// running; the files the server itself puts there are not, the fork
// contract's file only while it holds what the server wrote.
func TestDiffShowsFilesBesideTheServers(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "diff-hidden-" + prov})
			execOK(t, sb.ID, "sh", "-c", "echo mine > /run/shard/hidden")
			if _, err := e.c.Stop(ctxT(t), sb.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.c.WriteFile(ctxT(t), sb.ID, "/.shard/x", strings.NewReader("mine\n"), nil); err != nil {
				t.Fatal(err)
			}
			check := func(when string) {
				t.Helper()
				d, err := e.c.Diff(ctxT(t), sb.ID, "", false)
				if err != nil {
					t.Fatal(err)
				}
				ch := changesOf(d)
				for _, p := range []string{"/run/shard/hidden", "/.shard/x"} {
					if ch[p].Kind != "added" {
						t.Errorf("%s: %s is not in the diff: %+v", when, p, d.Changes)
					}
				}
				// busybox has no /run: the server made it, for /run/shard.
				for _, p := range []string{"/run", "/.shard", "/.shard/shard", "/run/shard", "/run/shard/fork", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf"} {
					if c, ok := ch[p]; ok {
						t.Errorf("%s: the server's own %s is in the diff: %+v", when, p, c)
					}
				}
			}
			check("stopped")
			if _, err := e.c.Start(ctxT(t), sb.ID); err != nil {
				t.Fatal(err)
			}
			check("running")
			// The fork contract's file, rewritten by the sandbox: it shows.
			execOK(t, sb.ID, "sh", "-c", `echo '{"id":"forged"}' > /run/shard/fork`)
			d, err := e.c.Diff(ctxT(t), sb.ID, "", false)
			if err != nil {
				t.Fatal(err)
			}
			if c := changesOf(d)[proto.ForkFile]; c.Kind != "added" {
				t.Errorf("a fork file the sandbox wrote is not in its diff: %+v", d.Changes)
			}
			// The server's directory replaced by a file of the sandbox's
			// own data: it shows, as a file.
			execOK(t, sb.ID, "sh", "-c", "rm -rf /run/shard && echo mine > /run/shard")
			if d, err = e.c.Diff(ctxT(t), sb.ID, "", false); err != nil {
				t.Fatal(err)
			}
			if c := changesOf(d)["/run/shard"]; c.Kind != "added" || c.Type != "file" {
				t.Errorf("a file in place of /run/shard is not in the diff: %+v", d.Changes)
			}
		})
	}
}

// TestDiffSparseFiles: two sandboxes of one image with files of a TiB of
// holes (as cheap to make as truncate -s 1099511627776): files the same but for
// where their data lies are the same, and a byte apart is told apart; a
// diff whose client gives up ends on the server, its copies unmounted and
// its request logged, not after reading terabytes of holes (which took
// the server tens of minutes, its client long gone); the next diff is
// answered.
func TestDiffSparseFiles(t *testing.T) {
	e := need(t)
	a := create(t, client.CreateRequest{Image: busybox, Name: "sparse-a"})
	b := create(t, client.CreateRequest{Image: busybox, Name: "sparse-b"})
	execOK(t, a.ID, "sh", "-c", "truncate -s 1099511627776 /big /byte /zeros")
	// /byte: an x at 512 GiB; /zeros: 64 KiB of zeros written at 1 MiB.
	execOK(t, b.ID, "sh", "-c", `truncate -s 1099511627776 /big /byte /zeros &&
		printf x | dd of=/byte bs=4096 seek=134217728 conv=notrunc 2>/dev/null &&
		dd if=/dev/zero of=/zeros bs=4096 seek=256 count=16 conv=notrunc 2>/dev/null`)
	diffMounts := func() []string {
		var out []string
		for _, m := range e.sandboxMounts() {
			if strings.HasPrefix(m, filepath.Join(e.dataDir, "run", "diff-")) {
				out = append(out, m)
			}
		}
		return out
	}
	if m := diffMounts(); len(m) != 0 {
		t.Fatalf("diff copies mounted before the test: %q", m)
	}
	logFrom := fileSize(e.serveLog)
	// The client gives up once the server has begun (a copy mounted), or
	// after 2 s.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	go func() {
		for ctx.Err() == nil && len(diffMounts()) == 0 {
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
	}()
	e.c.Diff(ctx, b.ID, a.ID, false)
	cancel()
	// The server's end of it: bounded polls, minutes before the fix.
	waitFor(t, 60*time.Second, func() bool { return len(diffMounts()) == 0 })
	logged := regexp.MustCompile(`msg=request .*path=/v0/sandboxes/` + b.ID + `/diff status=(200|499) `)
	waitFor(t, 60*time.Second, func() bool {
		lb, _ := os.ReadFile(e.serveLog)
		return int64(len(lb)) > logFrom && logged.Match(lb[logFrom:])
	})
	d, err := e.c.Diff(ctxT(t), b.ID, a.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	ch := changesOf(d)
	if c, ok := ch["/big"]; ok {
		t.Errorf("/big, holes on both sides: %+v", c)
	}
	if c, ok := ch["/zeros"]; ok {
		t.Errorf("/zeros, written zeros against holes: %+v", c)
	}
	if c := ch["/byte"]; c.Kind != "changed" || strings.Join(c.What, ",") != "content" || len(c.NotCompared) != 0 {
		t.Errorf("/byte, a byte apart: %+v", c)
	}
	if d.NotCompared != 0 {
		t.Errorf("%d not compared", d.NotCompared)
	}
}

// TestTree: the lineage of a source, its forks, a fork of a fork, a
// checkpoint and a restore from it; a removed fork leaves it unless --all,
// where it keeps its name, and is named by its checkpoint otherwise (a
// kept checkpoint whose only fork was removed says so); a fork is never
// earlier than its checkpoint; the CLI draws it.
func TestTree(t *testing.T) {
	e := need(t)
	base := create(t, client.CreateRequest{Image: busybox, Name: "tree-base"})
	forks, err := e.c.ForkMany(ctxT(t), base.ID, client.ForkRequest{Name: "tree", Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		t.Cleanup(func() { e.c.Remove(context.Background(), f.ID, true) })
	}
	deep, err := e.c.Fork(ctxT(t), forks[0].ID, client.ForkRequest{Name: "tree-deep"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), deep.ID, true) })
	ck, err := e.c.Checkpoint(ctxT(t), base.ID, client.CheckpointRequest{Tag: "mark"})
	if err != nil {
		t.Fatal(err)
	}
	restored, err := e.c.Restore(ctxT(t), ck.ID, client.RestoreRequest{Name: "tree-restored"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), restored.ID, true) })
	if err := e.c.Remove(ctxT(t), forks[1].ID, true); err != nil {
		t.Fatal(err)
	}
	// tree-base's resume starts from this one's checkpoint: kept.
	lone, err := e.c.Fork(ctxT(t), base.ID, client.ForkRequest{Name: "tree-lone"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.c.Remove(ctxT(t), lone.ID, true); err != nil {
		t.Fatal(err)
	}
	roots, err := e.c.Tree(ctxT(t), deep.Name, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(roots) != 1 || roots[0].ID != base.ID {
		t.Fatalf("roots: %+v", roots)
	}
	got := drawTree(roots[0], "")
	// The first fork's checkpoint is gone (docs/saved.md): tree-base resumes
	// from its later checkpoint, tree-1 from its own fork's, tree-2 was
	// removed. The tree still shows where tree-1 came from. tree-lone's
	// checkpoint, kept, names it.
	want := "sandbox tree-base\n checkpoint fork (removed) removed since: fork tree-2\n  sandbox tree-1\n   checkpoint fork\n    sandbox tree-deep\n" +
		" checkpoint checkpoint\n  sandbox tree-restored\n checkpoint fork removed since: fork tree-lone\n"
	if got != want {
		t.Fatalf("tree:\n%s\nwant:\n%s", got, want)
	}
	all, err := e.c.Tree(ctxT(t), base.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := drawTree(all[0], ""); !strings.Contains(got, "sandbox tree-2 (removed)") || !strings.Contains(got, "sandbox tree-lone (removed)") || strings.Contains(got, "removed since") {
		t.Fatalf("--all:\n%s", got)
	}
	forksAfterCheckpoints(t, all[0])
	out, errOut, code := e.cli(t, "", "tree", deep.Name)
	if code != 0 || !strings.Contains(out, "└─ tree-deep ("+deep.ID+") *") || !strings.Contains(out, "checkpoint "+ck.ID+" mark") ||
		!strings.Contains(out, "(removed since: fork tree-lone)") {
		t.Fatalf("shard tree: exit %d %s\n%s", code, errOut, out)
	}
	_, err = e.c.Tree(ctxT(t), "no-such-sandbox", false)
	wantCode(t, "the tree of no sandbox", err, 404, "sandbox_not_found", "no-such-sandbox")
}

// forksAfterCheckpoints checks that no fork below n is earlier than the
// checkpoint it came from.
func forksAfterCheckpoints(t *testing.T, n client.TreeNode) {
	t.Helper()
	for _, c := range n.Children {
		if n.Kind == "checkpoint" && c.Via == "fork" && c.At.Before(n.At) {
			t.Errorf("fork %s at %s, %s before its checkpoint %s", c.Name, c.At.Format(time.RFC3339Nano), n.At.Sub(c.At), n.ID)
		}
		forksAfterCheckpoints(t, c)
	}
}

// drawTree writes kind, name (a checkpoint's kind), removed and the
// removed sandboxes it names, one node a line, indented by depth.
func drawTree(n client.TreeNode, indent string) string {
	name := n.Name
	if n.Kind == "checkpoint" {
		name = n.Via
	}
	s := indent + n.Kind + " " + name
	if n.Removed {
		s += " (removed)"
	}
	if len(n.RemovedSandboxes) > 0 {
		var names []string
		for _, g := range n.RemovedSandboxes {
			names = append(names, g.Via+" "+g.Name)
		}
		s += " removed since: " + strings.Join(names, ", ")
	}
	s += "\n"
	for _, c := range n.Children {
		s += drawTree(c, indent+" ")
	}
	return s
}

// BenchmarkDiff: shard diff of two forks of the python image that each
// pip installed a package, through the API (the figure: under 200 ms),
// and with --patch.
func BenchmarkDiff(b *testing.B) {
	e := need(b)
	_, x, y := forkPair(b, "bdiff")
	for _, patch := range []bool{false, true} {
		name := "stat"
		if patch {
			name = "patch"
		}
		b.Run(name, func(b *testing.B) {
			var ds []time.Duration
			var n int
			for i := 0; i < b.N; i++ {
				start := time.Now()
				d, err := e.c.Diff(context.Background(), y.ID, x.ID, patch)
				if err != nil {
					b.Fatal(err)
				}
				ds = append(ds, time.Since(start))
				n = len(d.Changes)
			}
			report(b, samples{"diff": ds}, "", "diff")
			b.ReportMetric(float64(n), "changes")
		})
	}
}

// TestDiffPathPastTheHostsReach: a file whose path, with the host
// directory of the diff's copy, is longer than the host looks up (a
// sandbox makes one by relative paths; here a tar unpacks it) is not taken
// for absent and left out in silence: the diff is truncated, and what it
// reaches is listed.
func TestDiffPathPastTheHostsReach(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "diff-deep-" + prov})
			var tb bytes.Buffer
			tw := tar.NewWriter(&tb)
			// 4088 bytes of path, /hidden included: within what a sandbox
			// takes (4096), past it with any host directory before it.
			name := "deep"
			for len(name)+len("/hidden") < 4088 {
				name += "/" + strings.Repeat("d", min(200, 4088-len("/hidden")-len(name)-1))
			}
			if err := tw.WriteHeader(&tar.Header{Name: name + "/hidden", Mode: 0o644, Size: 5}); err != nil {
				t.Fatal(err)
			}
			tw.Write([]byte("mine\n"))
			tw.Close()
			if _, err := e.c.WriteArchive(ctxT(t), sb.ID, "/", &tb); err != nil {
				t.Fatal(err)
			}
			execOK(t, sb.ID, "sh", "-c", "echo x > /zz-after")
			d, err := e.c.Diff(ctxT(t), sb.ID, "", false)
			if err != nil {
				t.Fatal(err)
			}
			ch := changesOf(d)
			if !d.Truncated {
				t.Errorf("a diff that cannot reach /%s/hidden is not truncated", name)
			}
			if ch["/deep"].Kind != "added" || ch["/zz-after"].Kind != "added" {
				t.Errorf("what the diff reaches is not listed: %+v", d.Changes)
			}
		})
	}
}
