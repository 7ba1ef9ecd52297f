package crossnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/peer"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/sandbox"
	"github.com/useshards/shard/internal/store"
)

// world is two nodes: a (here: local) and b (remote), and what each was
// asked to do, in order, in one log.
type world struct {
	mu   sync.Mutex
	log  []string
	fail map[string]error // by step: "checkpoint", "send", "restore 2", "import", "cache", "import copy", "send environment"

	ckImage   string                        // the image of the checkpoints made here
	exporting bool                          // an export is under way
	envs      map[string]*store.Environment // here
	imgs      map[string]*image.Image       // here
	sandboxes []*store.Sandbox              // here
	envRecs   map[string]*cluster.EnvPlacement
	imgRecs   map[string]*cluster.ImagePlacement
	etcdAway  bool
	restores  int
}

func newWorld() *world {
	return &world{fail: map[string]error{}, envs: map[string]*store.Environment{}, imgs: map[string]*image.Image{},
		envRecs: map[string]*cluster.EnvPlacement{}, imgRecs: map[string]*cluster.ImagePlacement{}}
}

func (w *world) did(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, fmt.Sprintf(format, args...))
}

func (w *world) failed(step string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fail[step]
}

func (w *world) service() *Service {
	l := &local{w}
	return &Service{Checkpoints: l, Environments: l, Images: l, Sandboxes: l, Records: records{w}, Peers: peers{w},
		Log: slog.New(slog.DiscardHandler)}
}

// local is node a's services.
type local struct{ w *world }

func (l *local) Checkpoint(_ context.Context, id, tag string) (*store.Checkpoint, error) {
	l.w.did("a: checkpoint %s", id)
	if err := l.w.failed("checkpoint"); err != nil {
		return nil, err
	}
	return l.checkpoint("c1"), nil
}

func (l *local) checkpoint(id string) *store.Checkpoint {
	ck := &store.Checkpoint{ID: id}
	ck.Image = l.w.ckImage
	return ck
}

func (l *local) GetCheckpoint(_ context.Context, id string) (*store.Checkpoint, error) {
	return l.checkpoint(id), nil
}

func (l *local) RemoveCheckpoint(ctx context.Context, id string) error {
	l.w.mu.Lock()
	exporting := l.w.exporting
	l.w.mu.Unlock()
	if exporting {
		l.w.did("a: remove checkpoint %s WHILE IT IS EXPORTED", id)
	}
	if err := project.Require(ctx); err != nil {
		return err
	}
	l.w.did("a: remove checkpoint %s", id)
	return nil
}

// ExportCheckpoint writes the checkpoint in pieces, as the real one does,
// so a receiver that stops reading leaves it blocked until the pipe ends.
func (l *local) ExportCheckpoint(_ context.Context, id string, w io.Writer) error {
	l.w.mu.Lock()
	l.w.exporting = true
	l.w.mu.Unlock()
	defer func() {
		time.Sleep(10 * time.Millisecond) // an exporter slow to notice
		l.w.mu.Lock()
		l.w.exporting = false
		l.w.mu.Unlock()
	}()
	for i := range 64 {
		if _, err := fmt.Fprintf(w, "%s.%02d|", id, i); err != nil {
			return err
		}
	}
	return nil
}

func (l *local) ImportCheckpoint(_ context.Context, r io.Reader) (*store.Checkpoint, error) {
	b, _ := io.ReadAll(r)
	l.w.did("a: import checkpoint %q", b)
	if err := l.w.failed("import"); err != nil {
		return nil, err
	}
	return &store.Checkpoint{ID: string(b)}, nil
}

func (l *local) GetEnvironment(_ context.Context, name string) (*store.Environment, error) {
	if e := l.w.envs[name]; e != nil {
		return e, nil
	}
	return nil, errdefs.NotFound(client.CodeEnvironmentNotFound, "no environment %s", name)
}

func (l *local) CacheEnvironment(_ context.Context, e *store.Environment, origin string) error {
	l.w.did("a: keep environment %s (checkpoint %s) as node %s's", e.Name, e.Checkpoint, origin)
	return l.w.failed("cache")
}

func (l *local) RemoveEnvironment(_ context.Context, name string) error {
	l.w.did("a: remove environment %s", name)
	return nil
}

func (l *local) Get(_ context.Context, ref string) (*image.Image, error) {
	if img := l.w.imgs[ref]; img != nil {
		return img, nil
	}
	return nil, errdefs.NotFound(client.CodeImageNotFound, "no image %s", ref)
}

func (l *local) Remove(_ context.Context, ref string, shared bool) error {
	l.w.did("a: remove image %s", ref)
	return nil
}

func (l *local) ImportCopy(_ context.Context, r io.Reader, ref, digest, origin string) (*image.Image, error) {
	b, _ := io.ReadAll(r)
	l.w.did("a: keep %q as %s %s, node %s's", b, ref, digest, origin)
	if err := l.w.failed("import copy"); err != nil {
		return nil, err
	}
	return &image.Image{Ref: ref, Digest: digest, Origin: origin}, nil
}

func (l *local) List(ctx context.Context) ([]*store.Sandbox, error) {
	if _, all := project.Why(ctx); !all {
		return nil, errors.New("the users of a copy are every project's sandboxes")
	}
	return l.w.sandboxes, nil
}

// records is etcd, as node a reads it.
type records struct{ w *world }

var errEtcdAway = errdefs.Unavailable(client.CodeClusterUnavailable, "etcd is away")

func (records) Name() string { return "a" }

func (r records) Environment(_ context.Context, name string) (*cluster.EnvPlacement, error) {
	if r.w.etcdAway {
		return nil, errEtcdAway
	}
	if p := r.w.envRecs[name]; p != nil {
		return p, nil
	}
	return nil, errdefs.NotFound(client.CodeEnvironmentNotFound, "no environment %s in the cluster", name)
}

func (r records) Image(_ context.Context, ref string) (*cluster.ImagePlacement, error) {
	if r.w.etcdAway {
		return nil, errEtcdAway
	}
	if p := r.w.imgRecs[ref]; p != nil {
		return p, nil
	}
	return nil, errdefs.NotFound(client.CodeImageNotFound, "no image %s in the cluster", ref)
}

// peers reaches node b; any other node is down.
type peers struct{ w *world }

func (p peers) Up(_ context.Context, node string) (Peer, error) {
	if node != "b" {
		return nil, cluster.NodeDown(node)
	}
	return remote{p.w}, nil
}

// remote is node b, as a *peer.Node calls it.
type remote struct{ w *world }

func (remote) Name() string { return "b" }

func (b remote) SendCheckpoint(_ context.Context, r io.Reader, q url.Values) error {
	if err := b.w.failed("send"); err != nil {
		io.ReadFull(r, make([]byte, 6)) // the export is under way
		return err                      // and not read to its end (a node that went away)
	}
	data, _ := io.ReadAll(r)
	b.w.did("b: receive %d bytes %s", len(data), q.Encode())
	return nil
}

func (b remote) Restore(_ context.Context, id string, req client.RestoreRequest, hooks peer.Hooks) (*client.Sandbox, error) {
	b.w.restores++
	b.w.did("b: restore %s as %q from %s (hooks ignored %v, %s)", id, req.Name, hooks.FromNode, hooks.Ignore, hooks.Timeout)
	if err := b.w.failed(fmt.Sprintf("restore %d", b.w.restores)); err != nil {
		return nil, err
	}
	return &client.Sandbox{ID: fmt.Sprintf("f%d", b.w.restores), Name: req.Name, Node: "b"}, nil
}

func (b remote) RemoveCheckpoint(_ context.Context, id string) error {
	b.w.did("b: remove checkpoint %s", id)
	return nil
}

func (b remote) RemoveSandbox(_ context.Context, id string) error {
	b.w.did("b: remove sandbox %s", id)
	return nil
}

func (b remote) SendEnvironment(_ context.Context, name, to string) error {
	b.w.did("b: send environment %s to %s", name, to)
	return b.w.failed("send environment")
}

func (b remote) FetchImport(_ context.Context, ref string, into func(io.Reader) error) error {
	b.w.did("b: send image %s", ref)
	return into(strings.NewReader("layout of " + ref))
}

func inProject() context.Context { return project.With(context.Background(), "p") }

func checkLog(t *testing.T, w *world, want []string) {
	t.Helper()
	if !slices.Equal(w.log, want) {
		t.Errorf("the nodes did\n\t%s\nwant\n\t%s", strings.Join(w.log, "\n\t"), strings.Join(want, "\n\t"))
	}
}

var hookFailed = errdefs.New(errdefs.KindFailed, client.CodeForkHookFailed, "hook 10-reseed failed")

// A fork moved to another node leaves nothing behind whichever step
// fails: the forks restored already, the checkpoint sent there, the one
// made here (removed only once its export is done).
func TestFork(t *testing.T) {
	src := &store.Sandbox{ID: "s1", Name: "src"}
	const sent = "b: receive 384 bytes "
	tests := []struct {
		name      string
		req       sandbox.ForkRequest
		fail      map[string]error
		wantForks []string
		wantCode  string
		want      []string
	}{
		{"three forks", sandbox.ForkRequest{Name: "x", Count: 3, Hooks: sandbox.HookOptions{Timeout: 30 * time.Second}}, nil,
			[]string{"x-1", "x-2", "x-3"}, "", []string{
				"a: checkpoint s1", sent,
				`b: restore c1 as "x-1" from a (hooks ignored false, 30s)`,
				`b: restore c1 as "x-2" from a (hooks ignored false, 30s)`,
				`b: restore c1 as "x-3" from a (hooks ignored false, 30s)`,
				"b: remove checkpoint c1", "a: remove checkpoint c1",
			}},
		{"one fork, hooks ignored", sandbox.ForkRequest{Name: "x", Count: 1, Hooks: sandbox.HookOptions{Ignore: true}}, nil,
			[]string{"x"}, "", []string{
				"a: checkpoint s1", sent, `b: restore c1 as "x" from a (hooks ignored true, 0s)`,
				"b: remove checkpoint c1", "a: remove checkpoint c1",
			}},
		{"the 2nd restore of 3 fails", sandbox.ForkRequest{Name: "x", Count: 3}, map[string]error{"restore 2": hookFailed},
			nil, client.CodeForkHookFailed, []string{
				"a: checkpoint s1", sent,
				`b: restore c1 as "x-1" from a (hooks ignored false, 0s)`,
				`b: restore c1 as "x-2" from a (hooks ignored false, 0s)`,
				"b: remove sandbox f1", "b: remove checkpoint c1", "a: remove checkpoint c1",
			}},
		{"the only restore fails", sandbox.ForkRequest{Count: 1}, map[string]error{"restore 1": hookFailed},
			nil, client.CodeForkHookFailed, []string{
				"a: checkpoint s1", sent, `b: restore c1 as "" from a (hooks ignored false, 0s)`,
				"b: remove checkpoint c1", "a: remove checkpoint c1",
			}},
		{"the send fails", sandbox.ForkRequest{Count: 2}, map[string]error{"send": cluster.NodeDown("b")},
			nil, client.CodeNodeUnreachable, []string{"a: checkpoint s1", "a: remove checkpoint c1"}},
		{"the checkpoint fails", sandbox.ForkRequest{Count: 2}, map[string]error{"checkpoint": errdefs.New(errdefs.KindTimeout, client.CodeFreezeTimeout, "froze too long")},
			nil, client.CodeFreezeTimeout, []string{"a: checkpoint s1"}},
		{"hooks in the source", sandbox.ForkRequest{Count: 1, Hooks: sandbox.HookOptions{InSource: true}}, nil,
			nil, client.CodeUnsupported, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld()
			w.fail = tt.fail
			if w.fail == nil {
				w.fail = map[string]error{}
			}
			forks, err := w.service().Fork(inProject(), src, tt.req, remote{w})
			if got := errdefs.CodeOf(err); err != nil && got != tt.wantCode || err == nil && tt.wantCode != "" {
				t.Errorf("Fork = %v (%s), want code %q", err, got, tt.wantCode)
			}
			var names []string
			for _, f := range forks {
				names = append(names, f.Name)
			}
			if !slices.Equal(names, tt.wantForks) {
				t.Errorf("forks %v, want %v", names, tt.wantForks)
			}
			checkLog(t, w, tt.want)
		})
	}
}

// Send streams what the export writes, names an import's image for the
// receiver, and returns only once the export is done, also when the
// receiver gave up part way (the checkpoint may be removed then).
func TestSend(t *testing.T) {
	w := newWorld()
	w.ckImage = "localhost/p/busybox:1"
	s := w.service()
	n, err := s.Send(inProject(), remote{w}, "c1", url.Values{"environment": {"e"}})
	if err != nil || n != 384 {
		t.Fatalf("Send = %d, %v; want 384 bytes", n, err)
	}
	checkLog(t, w, []string{"b: receive 384 bytes environment=e&image=localhost%2Fp%2Fbusybox%3A1"})

	w = newWorld()
	w.fail["send"] = cluster.NodeDown("b")
	_, err = w.service().Send(inProject(), remote{w}, "c1", nil)
	if errdefs.CodeOf(err) != client.CodeNodeUnreachable || !strings.Contains(err.Error(), "send checkpoint c1 to node b") {
		t.Errorf("a refused send: %v", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.exporting {
		t.Error("Send returned while the export still read the checkpoint")
	}
}

// A checkpoint received is kept, with its environment; one whose
// environment cannot be kept is removed again, unless it was here before.
func TestReceive(t *testing.T) {
	env := &store.Environment{Name: "py", Checkpoint: "c9"}
	exists := errdefs.Conflict(client.CodeCheckpointExists, "checkpoint c9 is already on this node")
	refused := errdefs.Conflict(client.CodeEnvironmentExists, "environment py was built on this node")
	tests := []struct {
		name     string
		env      *store.Environment
		image    string
		fail     map[string]error
		wantID   string
		wantCode string
		want     []string
	}{
		{"a checkpoint", nil, "", nil, "c9", "", []string{`a: import checkpoint "c9"`}},
		{"an environment's", env, "", nil, "c9", "", []string{`a: import checkpoint "c9"`, "a: keep environment py (checkpoint c9) as node b's"}},
		{"an environment's not kept", env, "", map[string]error{"cache": refused}, "", client.CodeEnvironmentExists, []string{
			`a: import checkpoint "c9"`, "a: keep environment py (checkpoint c9) as node b's", "a: remove checkpoint c9"}},
		{"an environment's, here before", env, "", map[string]error{"import": exists}, "c9", "", []string{
			`a: import checkpoint "c9"`, "a: keep environment py (checkpoint c9) as node b's"}},
		{"an environment's, here before, not kept", env, "", map[string]error{"import": exists, "cache": refused}, "", client.CodeEnvironmentExists, []string{
			`a: import checkpoint "c9"`, "a: keep environment py (checkpoint c9) as node b's"}},
		{"a checkpoint here before", nil, "", map[string]error{"import": exists}, "", client.CodeCheckpointExists, []string{`a: import checkpoint "c9"`}},
		{"of an import of b's", nil, "localhost/p/busybox:1", nil, "c9", "", []string{
			"b: send image localhost/p/busybox:1", `a: keep "layout of localhost/p/busybox:1" as localhost/p/busybox:1 sha256:1, node b's`,
			`a: import checkpoint "c9"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld()
			if tt.fail != nil {
				w.fail = tt.fail
			}
			w.imgRecs["localhost/p/busybox:1"] = &cluster.ImagePlacement{Node: "b", Digest: "sha256:1"}
			ck, err := w.service().Receive(inProject(), strings.NewReader("c9"), tt.env, tt.image, "b")
			if errdefs.CodeOf(err) != tt.wantCode && (err != nil || tt.wantCode != "") {
				t.Errorf("Receive = %v, want code %q", err, tt.wantCode)
			}
			if err == nil && ck.ID != tt.wantID {
				t.Errorf("kept checkpoint %s, want %s", ck.ID, tt.wantID)
			}
			checkLog(t, w, tt.want)
		})
	}
}

// An environment of another node is copied here on its first use, kept
// while etcd names its checkpoint, and dropped once its origin rebuilt or
// removed it; with etcd away a copy is used as it is.
func TestEnsureEnvironment(t *testing.T) {
	copyOf := func(ck string) *store.Environment { return &store.Environment{Name: "py", Checkpoint: ck, Origin: "b"} }
	tests := []struct {
		name     string
		here     *store.Environment
		rec      *cluster.EnvPlacement
		etcdAway bool
		fail     error // b's send
		wantCode string
		want     []string
	}{
		{"built here", &store.Environment{Name: "py", Checkpoint: "c1"}, nil, false, nil, "", nil},
		{"a copy of what etcd names", copyOf("c1"), &cluster.EnvPlacement{Node: "b", Checkpoint: "c1"}, false, nil, "", nil},
		{"a copy, etcd away", copyOf("c1"), nil, true, nil, "", nil},
		{"none, etcd away", nil, nil, true, nil, client.CodeClusterUnavailable, nil},
		{"first use", nil, &cluster.EnvPlacement{Node: "b", Checkpoint: "c1"}, false, nil, "", []string{"b: send environment py to a"}},
		{"rebuilt at its origin", copyOf("c0"), &cluster.EnvPlacement{Node: "b", Checkpoint: "c1"}, false, nil, "", []string{
			"a: remove environment py", "b: send environment py to a"}},
		{"removed at its origin", copyOf("c0"), nil, false, nil, client.CodeEnvironmentNotFound, []string{"a: remove environment py"}},
		{"nowhere", nil, nil, false, nil, client.CodeEnvironmentNotFound, nil},
		{"its origin down", nil, &cluster.EnvPlacement{Node: "c", Checkpoint: "c1"}, false, nil, client.CodeNodeUnreachable, nil},
		{"its origin fails to send it", nil, &cluster.EnvPlacement{Node: "b", Checkpoint: "c1"}, false, errdefs.New(errdefs.KindNoSpace, "", "disk full"),
			client.CodeInsufficientStorage, []string{"b: send environment py to a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld()
			if tt.here != nil {
				w.envs["py"] = tt.here
			}
			if tt.rec != nil {
				w.envRecs["py"] = tt.rec
			}
			w.etcdAway = tt.etcdAway
			if tt.fail != nil {
				w.fail["send environment"] = tt.fail
			}
			err := w.service().EnsureEnvironment(inProject(), "py")
			if errdefs.CodeOf(err) != tt.wantCode && (err != nil || tt.wantCode != "") {
				t.Errorf("EnsureEnvironment = %v, want code %q", err, tt.wantCode)
			}
			checkLog(t, w, tt.want)
		})
	}
}

// An import of another node is copied here on its first use (checked
// against the digest etcd records), kept while etcd records that digest,
// and dropped (unless a sandbox uses it) once it is gone at its origin.
func TestEnsureImport(t *testing.T) {
	const ref = "localhost/p/busybox:1"
	canon, ok := image.ImportName(ref)
	if !ok {
		t.Fatalf("%s is no import's name", ref)
	}
	copyOf := func(digest string) *image.Image { return &image.Image{Ref: ref, Digest: digest, Origin: "b"} }
	mismatch := errdefs.New(errdefs.KindFailed, client.CodeImageCopyMismatch, "the copy does not match sha256:2")
	tests := []struct {
		name     string
		ref      string
		here     *image.Image
		rec      *cluster.ImagePlacement
		etcdAway bool
		used     bool
		fail     error // the copy's
		wantCode string
		want     []string
	}{
		{"not an import", "docker.io/library/busybox:1", nil, nil, false, false, nil, "", nil},
		{"imported here", ref, &image.Image{Ref: ref, Digest: "sha256:1"}, nil, false, false, nil, "", nil},
		{"a copy of what etcd records", ref, copyOf("sha256:1"), &cluster.ImagePlacement{Node: "b", Digest: "sha256:1"}, false, false, nil, "", nil},
		{"a copy, etcd away", ref, copyOf("sha256:1"), nil, true, false, nil, "", nil},
		{"none, etcd away", ref, nil, nil, true, false, nil, client.CodeClusterUnavailable, nil},
		{"unknown", ref, nil, nil, false, false, nil, "", nil},
		{"recorded as this node's", ref, nil, &cluster.ImagePlacement{Node: "a", Digest: "sha256:1"}, false, false, nil, "", nil},
		{"first use", ref, nil, &cluster.ImagePlacement{Node: "b", Digest: "sha256:2"}, false, false, nil, "", []string{
			"b: send image " + canon, `a: keep "layout of ` + canon + `" as ` + canon + " sha256:2, node b's"}},
		{"imported again at its origin", ref, copyOf("sha256:1"), &cluster.ImagePlacement{Node: "b", Digest: "sha256:2"}, false, false, nil, "", []string{
			"b: send image " + canon, `a: keep "layout of ` + canon + `" as ` + canon + " sha256:2, node b's"}},
		{"the copy does not match", ref, nil, &cluster.ImagePlacement{Node: "b", Digest: "sha256:2"}, false, false, mismatch, client.CodeImageCopyMismatch, []string{
			"b: send image " + canon, `a: keep "layout of ` + canon + `" as ` + canon + " sha256:2, node b's"}},
		{"its origin down", ref, nil, &cluster.ImagePlacement{Node: "c", Digest: "sha256:2"}, false, false, nil, client.CodeNodeUnreachable, nil},
		{"removed at its origin", ref, copyOf("sha256:1"), nil, false, false, nil, client.CodeImageNotFound, []string{"a: remove image " + ref}},
		{"removed at its origin, used here", ref, copyOf("sha256:1"), nil, false, true, nil, client.CodeImageNotFound, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld()
			if tt.here != nil {
				w.imgs[tt.ref] = tt.here
			}
			if tt.rec != nil {
				w.imgRecs[canon] = tt.rec
			}
			w.etcdAway = tt.etcdAway
			if tt.used {
				sb := &store.Sandbox{ID: "s1"}
				sb.ImageDigest = "sha256:1"
				w.sandboxes = []*store.Sandbox{sb}
			}
			if tt.fail != nil {
				w.fail["import copy"] = tt.fail
			}
			err := w.service().EnsureImport(inProject(), tt.ref)
			if errdefs.CodeOf(err) != tt.wantCode && (err != nil || tt.wantCode != "") {
				t.Errorf("EnsureImport = %v, want code %q", err, tt.wantCode)
			}
			checkLog(t, w, tt.want)
		})
	}
}

// SendEnvironment sends an environment built here, never a copy, to the
// node named, with the environment for the receiver to keep it by.
func TestSendEnvironment(t *testing.T) {
	tests := []struct {
		name     string
		env      *store.Environment
		to       string
		wantCode string
		wantSent bool
	}{
		{"built here", &store.Environment{Name: "py", Checkpoint: "c1"}, "b", "", true},
		{"a copy", &store.Environment{Name: "py", Checkpoint: "c1", Origin: "c"}, "b", client.CodeEnvironmentCopy, false},
		{"to a node that is down", &store.Environment{Name: "py", Checkpoint: "c1"}, "c", client.CodeNodeUnreachable, false},
		{"nothing here", nil, "b", client.CodeEnvironmentNotFound, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld()
			if tt.env != nil {
				w.envs["py"] = tt.env
			}
			n, err := w.service().SendEnvironment(inProject(), "py", tt.to)
			if errdefs.CodeOf(err) != tt.wantCode && (err != nil || tt.wantCode != "") {
				t.Errorf("SendEnvironment = %v, want code %q", err, tt.wantCode)
			}
			if sent := len(w.log) == 1 && strings.HasPrefix(w.log[0], "b: receive 384 bytes environment="); sent != tt.wantSent || tt.wantSent && n != 384 {
				t.Errorf("sent %d bytes: %v, want sent %v", n, w.log, tt.wantSent)
			}
			if tt.wantSent {
				q, _ := url.ParseQuery(strings.TrimPrefix(w.log[0], "b: receive 384 bytes "))
				if got, err := EnvironmentOf(q); err != nil || got.Name != "py" || got.Checkpoint != "c1" {
					t.Errorf("the receiver reads the environment as %+v, %v", got, err)
				}
			}
		})
	}
	if _, err := EnvironmentOf(url.Values{"environment": {"%%%"}}); errdefs.KindOf(err) != errdefs.KindInvalid {
		t.Errorf("a bad environment= is %v, want invalid", err)
	}
}
