package integration

import (
	"context"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

// TestGrantFilesNoClobber: on both providers, a file grant over a path the
// sandbox has is refused (409 path_exists) and /etc/passwd survives it; a
// grant whose path goes through a symlink is refused and writes nothing
// where it points; an ungrant after the sandbox swapped the granted file,
// or a directory above it, for a symlink to /etc/passwd removes neither
// the link's target nor anything else; the grant's own file and the
// directories it made go on a plain ungrant. On gvisor, a fork's copy of a
// grant owns the fork's copy of the file and nothing else.
func TestGrantFilesNoClobber(t *testing.T) {
	e := need(t)
	for _, s := range []string{"GRANT_FILE_A", "GRANT_FILE_B"} {
		if _, err := e.c.SetSecret(ctxT(t), s, []byte("value-of-"+s)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.c.RemoveSecret(context.Background(), s) })
	}
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "grantfile-" + prov})
			passwd := execOK(t, sb.ID, "cat", "/etc/passwd")
			if !strings.Contains(passwd, "root:") {
				t.Fatalf("/etc/passwd: %q", passwd)
			}
			passwdIntact := func(when string) {
				t.Helper()
				res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"cat", "/etc/passwd"}})
				if err != nil || res.ExitCode != 0 || string(res.Stdout) != passwd {
					t.Fatalf("%s: /etc/passwd is %q (exit %d, %v), was %q", when, res.Stdout, res.ExitCode, err, passwd)
				}
			}
			noGrants := func(when string) {
				t.Helper()
				gs, err := e.c.Grants(ctxT(t), sb.ID)
				if err != nil || len(gs) != 0 {
					t.Fatalf("%s: grants %+v %v", when, gs, err)
				}
			}

			_, err := e.c.Grant(ctxT(t), sb.ID, client.Grant{Secret: "GRANT_FILE_A", File: "/etc/passwd"})
			wantCode(t, "a grant over /etc/passwd", err, 409, "path_exists", "/etc/passwd")
			passwdIntact("after a refused grant")
			noGrants("after a refused grant")
			// Through the CLI too, with the message on stderr.
			if _, errOut, code := e.cli(t, "", "grant", sb.ID, "GRANT_FILE_A", "--file", "/etc/passwd"); code == 0 || !strings.Contains(errOut, "exists") {
				t.Fatalf("shard grant --file /etc/passwd: exit %d, %s", code, errOut)
			}
			passwdIntact("after a refused grant from the CLI")

			// A symlinked directory on the way: refused, nothing written
			// where it points.
			execOK(t, sb.ID, "ln", "-s", "/etc", "/tmp/via")
			_, err = e.c.Grant(ctxT(t), sb.ID, client.Grant{Secret: "GRANT_FILE_A", File: "/tmp/via/passwd"})
			wantCode(t, "a grant through a symlinked directory", err, 409, "path_unsafe", "/tmp/via")
			_, err = e.c.Grant(ctxT(t), sb.ID, client.Grant{Secret: "GRANT_FILE_A", File: "/tmp/via/shard-new-file"})
			wantCode(t, "a new file through a symlinked directory", err, 409, "path_unsafe", "/tmp/via")
			passwdIntact("after grants through a symlink")
			if out := execOK(t, sb.ID, "sh", "-c", "ls /etc/shard-new-file 2>&1 || true"); !strings.Contains(out, "No such file") {
				t.Fatalf("a file was written through the symlink: %q", out)
			}
			noGrants("after grants through a symlink")

			// A plain grant and ungrant: the file and the directories the
			// grant made go.
			if _, err := e.c.Grant(ctxT(t), sb.ID, client.Grant{Secret: "GRANT_FILE_A", File: "/srv/grant/a/key"}); err != nil {
				t.Fatal(err)
			}
			if got := execOK(t, sb.ID, "cat", "/srv/grant/a/key"); got != "value-of-GRANT_FILE_A" {
				t.Fatalf("the granted file holds %q", got)
			}
			if got := execOK(t, sb.ID, "stat", "-c", "%a %u", "/srv/grant/a/key"); got != "400 0\n" {
				t.Fatalf("the granted file's mode and owner: %q", got)
			}
			// Another secret to the same path: refused; the same one again
			// (its own file): replaced.
			_, err = e.c.Grant(ctxT(t), sb.ID, client.Grant{Secret: "GRANT_FILE_B", File: "/srv/grant/a/key"})
			wantCode(t, "another grant's path", err, 409, "path_exists", "GRANT_FILE_A")
			if _, err := e.c.Grant(ctxT(t), sb.ID, client.Grant{Secret: "GRANT_FILE_A", File: "/srv/grant/a/key"}); err != nil {
				t.Fatalf("the same grant again: %v", err)
			}
			execOK(t, sb.ID, "touch", "/srv/keep-me")
			if _, err := e.c.Ungrant(ctxT(t), sb.ID, "GRANT_FILE_A"); err != nil {
				t.Fatal(err)
			}
			if out := execOK(t, sb.ID, "sh", "-c", "ls -A /srv"); out != "keep-me\n" {
				t.Fatalf("after ungrant, /srv holds %q; want only what was there", out)
			}

			// The sandbox swaps the granted file for a symlink to
			// /etc/passwd: the ungrant removes neither.
			if _, err := e.c.Grant(ctxT(t), sb.ID, client.Grant{Secret: "GRANT_FILE_A", File: "/tmp/g1/passwd"}); err != nil {
				t.Fatal(err)
			}
			execOK(t, sb.ID, "sh", "-c", "rm /tmp/g1/passwd && ln -s /etc/passwd /tmp/g1/passwd")
			if _, err := e.c.Ungrant(ctxT(t), sb.ID, "GRANT_FILE_A"); err != nil {
				t.Fatal(err)
			}
			passwdIntact("after the ungrant of a file swapped for a symlink")
			if out := execOK(t, sb.ID, "readlink", "/tmp/g1/passwd"); out != "/etc/passwd\n" {
				t.Fatalf("what the sandbox put in the file's place: %q", out)
			}

			// ... or a directory above it for a symlink to /etc: the
			// ungrant does not reach /etc/passwd through it.
			if _, err := e.c.Grant(ctxT(t), sb.ID, client.Grant{Secret: "GRANT_FILE_A", File: "/tmp/g2/passwd"}); err != nil {
				t.Fatal(err)
			}
			execOK(t, sb.ID, "sh", "-c", "mv /tmp/g2 /tmp/g2.old && ln -s /etc /tmp/g2")
			if _, err := e.c.Ungrant(ctxT(t), sb.ID, "GRANT_FILE_A"); err != nil {
				t.Fatal(err)
			}
			passwdIntact("after the ungrant of a file whose directory was swapped for a symlink")
			noGrants("after the ungrants")

			if prov != "gvisor" {
				return
			}
			// A fork's copy of the grant owns the fork's copy of the file.
			if _, err := e.c.Grant(ctxT(t), sb.ID, client.Grant{Secret: "GRANT_FILE_B", File: "/srv/fork/key"}); err != nil {
				t.Fatal(err)
			}
			f, err := e.c.Fork(ctxT(t), sb.ID, client.ForkRequest{Name: "grantfile-fork"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.c.Remove(context.Background(), f.ID, true) })
			_, err = e.c.Grant(ctxT(t), f.ID, client.Grant{Secret: "GRANT_FILE_A", File: "/etc/passwd"})
			wantCode(t, "a grant over the fork's /etc/passwd", err, 409, "path_exists", "/etc/passwd")
			_, err = e.c.Grant(ctxT(t), f.ID, client.Grant{Secret: "GRANT_FILE_A", File: "/srv/fork/key"})
			wantCode(t, "another secret to the fork's copy of a grant's path", err, 409, "path_exists", "GRANT_FILE_B")
			if _, err := e.c.Grant(ctxT(t), f.ID, client.Grant{Secret: "GRANT_FILE_B", File: "/srv/fork/key"}); err != nil {
				t.Fatalf("the fork's grant over its own file: %v", err)
			}
			if _, err := e.c.Ungrant(ctxT(t), f.ID, "GRANT_FILE_B"); err != nil {
				t.Fatal(err)
			}
			if out := execOK(t, f.ID, "ls", "-A", "/srv"); out != "keep-me\n" {
				t.Fatalf("the fork's /srv after its ungrant: %q", out)
			}
			if got := execOK(t, sb.ID, "cat", "/srv/fork/key"); got != "value-of-GRANT_FILE_B" {
				t.Fatalf("the fork's ungrant reached its source: %q", got)
			}
		})
	}
}
