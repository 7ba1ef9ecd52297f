package sandbox

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/useshards/shard/internal/agent/host"

	"github.com/useshards/shard/internal/agent/proto"
	"github.com/useshards/shard/internal/framing"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/secrets"
	"github.com/useshards/shard/internal/store"

	"github.com/useshards/shard/internal/testenv"
)

// fakeSandboxFS stands for a sandbox's files behind an agent: it answers the
// grant file ops as the real agent does (see internal/agent/guest's tests for
// the real thing on real files) and records what it was asked.
type fakeSandboxFS struct {
	mu          sync.Mutex
	files       map[string]fakeFile
	dirs        map[string]bool
	reqs        []proto.Request
	failUngrant bool
	oldAgent    bool       // knows no grant_file: an agent older than it
	caps        proto.Caps // what its ping lists (none: an agent from before caps)
}

type fakeFile struct {
	data    string
	granted bool // looks like a grant's file: regular, root's, 0400
}

func (f *fakeSandboxFS) do(req proto.Request) proto.Reply {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Op == proto.OpPing {
		return proto.Reply{OK: true, Caps: f.caps}
	}
	f.reqs = append(f.reqs, proto.Request{Op: req.Op, Path: req.Path, Replace: req.Replace, Dirs: req.Dirs, Mode: req.Mode})
	if f.oldAgent && (req.Op == proto.OpGrantFile || req.Op == proto.OpUngrantFile) {
		return proto.Reply{Error: "unknown op " + req.Op}
	}
	switch req.Op {
	case proto.OpGrantFile:
		if e, ok := f.files[req.Path]; ok && (!req.Replace || !e.granted) {
			return proto.Reply{Error: req.Path + " exists", Code: proto.CodePathExists}
		}
		var made []string
		for d := filepath.Dir(req.Path); !f.dirs[d]; d = filepath.Dir(d) {
			made = append([]string{d}, made...)
		}
		for _, d := range made {
			f.dirs[d] = true
		}
		f.files[req.Path] = fakeFile{data: string(req.Data), granted: true}
		return proto.Reply{OK: true, Made: made}
	case proto.OpUngrantFile:
		if f.failUngrant {
			return proto.Reply{Error: "input/output error"}
		}
		r := proto.Reply{OK: true}
		if e, ok := f.files[req.Path]; ok {
			if e.granted {
				delete(f.files, req.Path)
			} else {
				r.Left = req.Path + " is no longer the file the grant wrote"
			}
		}
		for i := len(req.Dirs) - 1; i >= 0; i-- {
			empty := true
			for p := range f.files {
				if strings.HasPrefix(p, req.Dirs[i]+"/") {
					empty = false
				}
			}
			if empty {
				delete(f.dirs, req.Dirs[i])
			}
		}
		return r
	}
	return proto.Reply{Error: "unknown op " + req.Op, UnknownOp: true}
}

// serve answers agent connections on ln with fs.
func (f *fakeSandboxFS) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_, p, err := framing.Read(c)
			if err != nil {
				return
			}
			var req proto.Request
			if json.Unmarshal(p, &req) != nil {
				return
			}
			b, _ := json.Marshal(f.do(req))
			framing.Write(c, proto.FrameReply, b)
			io.Copy(io.Discard, c)
		}()
	}
}

// with runs fn with f locked (the agent's goroutines share it).
func (f *fakeSandboxFS) with(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

func (f *fakeSandboxFS) file(path string) (e fakeFile, ok bool) {
	f.with(func() { e, ok = f.files[path] })
	return
}

func (f *fakeSandboxFS) takeReqs() []proto.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.reqs
	f.reqs = nil
	return r
}

// grantTestService is a Service with a store, secrets and two running sandboxes
// ("src", and "fork" with a copy of src's grants made by the test) whose
// agent is fs.
func grantTestService(t *testing.T) (*Service, *fakeSandboxFS) {
	t.Helper()
	ctx := own()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "shard.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sec, err := secrets.Open(st, filepath.Join(dir, "secret.key"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"one", "two", "three"} {
		if _, err := sec.Set(ctx, n, []byte("value-of-"+n)); err != nil {
			t.Fatal(err)
		}
	}
	// The agent's port on a loopback address of the test's own.
	var ln net.Listener
	var ip netip.Addr
	for i := 2; i < 250 && ln == nil; i++ {
		ip = netip.AddrFrom4([4]byte{127, 93, byte(time.Now().UnixNano() % 200), byte(i)})
		ln, _ = net.Listen("tcp", netip.AddrPortFrom(ip, proto.Port).String())
	}
	if ln == nil {
		if testenv.Strict() {
			t.Fatal("no loopback address with the agent's port free, and SHARD_INTEGRATION=1 says this run must have one")
		}
		t.Skip("no loopback address with the agent's port free")
	}
	fs := &fakeSandboxFS{files: map[string]fakeFile{"/etc/passwd": {data: "root:x:0:0"}}, dirs: map[string]bool{"/": true, "/etc": true},
		caps: proto.Caps{proto.CapDetach, proto.CapStdinCredit, proto.CapMemCheck, proto.CapGrantFile, proto.CapForked}}
	go fs.serve(ln)
	t.Cleanup(func() { ln.Close() })
	for _, n := range []string{"src", "fork"} {
		if err := st.CreateSandbox(ctx, &store.Sandbox{ID: n + "-id", Name: n, State: StateRunning, IP: ip.String(), Token: "t"},
			&store.EventSpec{Type: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	s := link(&Service{cfg: Config{Store: st, Secrets: sec, Net: newFakeNet(), Log: slog.New(slog.DiscardHandler)}})
	return s, fs
}

func wantAPICode(t *testing.T, what string, err error, kind errdefs.Kind, code string) {
	t.Helper()
	if errdefs.KindOf(err) != kind || errdefs.CodeOf(err) != code {
		t.Fatalf("%s: %v (%s %s), want %s %s", what, err, errdefs.KindOf(err), errdefs.CodeOf(err), kind, code)
	}
}

// TestGrantFileOwnership: a file grant replaces nothing it did not write,
// and asks the agent to replace or remove only the path it owns, with the
// directories it made; a fork's copy of the grant owns the fork's copy of
// the file.
func TestGrantFileOwnership(t *testing.T) {
	s, fs := grantTestService(t)
	ctx := own()

	_, err := s.Access().Grant(ctx, "src", GrantRequest{Secret: "one", File: "/etc/passwd"})
	wantAPICode(t, "a grant over /etc/passwd", err, errdefs.KindConflict, "path_exists")
	if !strings.Contains(err.Error(), "/etc/passwd") {
		t.Fatalf("message %q does not name the path", err)
	}
	if e, _ := fs.file("/etc/passwd"); e.data != "root:x:0:0" {
		t.Fatal("/etc/passwd replaced")
	}
	if sb, _ := s.cfg.Store.GetSandbox(ctx, "src"); len(sb.Grants) != 0 {
		t.Fatalf("a refused grant was recorded: %+v", sb.Grants)
	}

	sb, err := s.Access().Grant(ctx, "src", GrantRequest{Secret: "one", File: "/run/app/key"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/run", "/run/app"}; len(sb.Grants) != 1 || !reflect.DeepEqual(sb.Grants[0].Dirs, want) {
		t.Fatalf("grants %+v, want the directories it made: %q", sb.Grants, want)
	}
	if r := fs.takeReqs(); len(r) != 2 || r[1].Op != proto.OpGrantFile || r[1].Replace || r[1].Mode != 0o400 {
		t.Fatalf("agent asked %+v", r)
	}

	_, err = s.Access().Grant(ctx, "src", GrantRequest{Secret: "two", File: "/run/app/key"})
	wantAPICode(t, "another secret to the same path", err, errdefs.KindConflict, "path_exists")
	if r := fs.takeReqs(); len(r) != 0 {
		t.Fatalf("the agent was asked %+v", r)
	}

	// The grant that wrote it may write it again (a new value).
	if sb, err = s.Access().Grant(ctx, "src", GrantRequest{Secret: "one", File: "/run/app/key"}); err != nil {
		t.Fatal(err)
	}
	if r := fs.takeReqs(); len(r) != 1 || !r[0].Replace {
		t.Fatalf("a grant's own path again: agent asked %+v", r)
	}
	if !reflect.DeepEqual(sb.Grants[0].Dirs, []string{"/run", "/run/app"}) {
		t.Fatalf("the directories it made were forgotten: %+v", sb.Grants)
	}

	// A fork: the record's copy of the grant owns the fork's copy of the file.
	if _, err := s.cfg.Store.UpdateSandbox(ctx, "fork-id", func(r *store.Sandbox) (*store.EventSpec, error) {
		r.Grants = copyGrants(sb.Grants)
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Access().Grant(ctx, "fork", GrantRequest{Secret: "one", File: "/run/app/key"}); err != nil {
		t.Fatal(err)
	}
	if r := fs.takeReqs(); len(r) != 1 || !r[0].Replace {
		t.Fatalf("the fork's own path again: agent asked %+v", r)
	}
	if _, err := s.Access().Ungrant(ctx, "fork", "one"); err != nil {
		t.Fatal(err)
	}
	if r := fs.takeReqs(); len(r) != 1 || r[0].Op != proto.OpUngrantFile || r[0].Path != "/run/app/key" || !reflect.DeepEqual(r[0].Dirs, []string{"/run", "/run/app"}) {
		t.Fatalf("ungrant on the fork: agent asked %+v", r)
	}
	fs.with(func() {
		if _, ok := fs.files["/run/app/key"]; ok || fs.dirs["/run"] {
			t.Errorf("after ungrant: files %v dirs %v", fs.files, fs.dirs)
		}
	})

	// The sandbox swaps the file for something else: the ungrant goes
	// through (the grant is gone) but leaves what is there.
	if _, err := s.Access().Grant(ctx, "src", GrantRequest{Secret: "one", File: "/run/app/key"}); err != nil {
		t.Fatal(err)
	}
	fs.with(func() { fs.files["/run/app/key"] = fakeFile{data: "a symlink to /etc/shadow"} })
	// Nor does writing it again replace it.
	_, err = s.Access().Grant(ctx, "src", GrantRequest{Secret: "one", File: "/run/app/key"})
	wantAPICode(t, "a grant's own path, swapped", err, errdefs.KindConflict, "path_exists")
	if sb, err = s.Access().Ungrant(ctx, "src", "one"); err != nil || len(sb.Grants) != 0 {
		t.Fatalf("ungrant: %+v %v", sb, err)
	}
	if e, _ := fs.file("/run/app/key"); e.data != "a symlink to /etc/shadow" {
		t.Fatal("the ungrant removed what the sandbox put in the file's place")
	}
	fs.takeReqs()

	// A grant moved to another path: the new file is written first, then
	// the old one removed; if that fails, the new one goes again and the
	// grant stays as it was.
	if _, err := s.Access().Grant(ctx, "src", GrantRequest{Secret: "three", File: "/a/one"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Access().Grant(ctx, "src", GrantRequest{Secret: "three", File: "/a/two"}); err != nil {
		t.Fatal(err)
	}
	r := fs.takeReqs()
	if len(r) != 3 || r[1].Op != proto.OpGrantFile || r[1].Path != "/a/two" || r[2].Op != proto.OpUngrantFile || r[2].Path != "/a/one" {
		t.Fatalf("a moved grant: agent asked %+v", r)
	}
	fs.with(func() { fs.failUngrant = true })
	_, err = s.Access().Grant(ctx, "src", GrantRequest{Secret: "three", File: "/a/three"})
	wantAPICode(t, "a move whose old file cannot be removed", err, errdefs.KindUpstream, "grant_failed")
	if g := grantOf(mustGet(t, s, "src"), "three"); g == nil || g.File != "/a/two" {
		t.Fatalf("the grant after a failed move: %+v", g)
	}
	fs.with(func() { fs.failUngrant = false })

	// An agent that does not list grant_file is not sent the secret.
	fs.takeReqs()
	fs.with(func() { fs.caps = proto.Caps{proto.CapDetach} })
	_, err = s.Access().Grant(ctx, "src", GrantRequest{Secret: "two", File: "/b/key"})
	wantAPICode(t, "an agent without grant_file", err, errdefs.KindUnsupported, "unsupported")
	if r := fs.takeReqs(); len(r) != 0 {
		t.Fatalf("an agent without grant_file was asked %+v", r)
	}

	// An agent from before caps that knows only the old ops refuses in
	// words: it would replace.
	fs.with(func() { fs.caps, fs.oldAgent = nil, true })
	_, err = s.Access().Grant(ctx, "src", GrantRequest{Secret: "two", File: "/b/key"})
	wantAPICode(t, "an old agent", err, errdefs.KindUnsupported, "unsupported")
}

func mustGet(t *testing.T, s *Service, name string) *store.Sandbox {
	t.Helper()
	sb, err := s.cfg.Store.GetSandbox(own(), name)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func TestFileOpError(t *testing.T) {
	sb := &store.Sandbox{Name: "py"}
	failed := fmt.Errorf("agent: x")
	for _, tc := range []struct {
		r    *proto.Reply
		err  error
		kind errdefs.Kind
		code string
	}{
		{&proto.Reply{Error: "/etc/passwd exists", Code: proto.CodePathExists}, failed, errdefs.KindConflict, "path_exists"},
		{&proto.Reply{Error: "/etc/app is a symlink", Code: proto.CodePathUnsafe}, failed, errdefs.KindConflict, "path_unsafe"},
		{&proto.Reply{Error: "unknown op grant_file", UnknownOp: true}, fmt.Errorf("agent: unknown op grant_file: %w", host.ErrUnsupported), errdefs.KindUnsupported, "unsupported"},
		{&proto.Reply{Error: "read-only file system"}, failed, errdefs.KindUpstream, "grant_failed"},
		{nil, failed, errdefs.KindUpstream, "grant_failed"},
	} {
		err := fileOpError(sb, "write", "/etc/passwd", tc.r, tc.err)
		if errdefs.KindOf(err) != tc.kind || errdefs.CodeOf(err) != tc.code || !strings.Contains(err.Error(), "py") {
			t.Errorf("%+v: %v (%s %s), want %s %s", tc.r, err, errdefs.KindOf(err), errdefs.CodeOf(err), tc.kind, tc.code)
		}
	}
}
