package sandbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/useshards/shard/internal/agent/proto"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/useshards/shard/internal/hostdisk"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/network"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/rootfs"
	"github.com/useshards/shard/internal/sparse"
	"github.com/useshards/shard/internal/store"
)

// A Service over fakes: a runtime, files and network that only keep count,
// an agent that answers every call, and the real metadata store in a
// temporary directory. It drives the lifecycle's failure paths in a unit
// test; the integration tests are the proof on real runsc and runc.

const fakeImage = "sha256:fake"

type fakes struct {
	t   *testing.T
	svc *Service
	p   *fakeProvider
	fs  *fakeStorage
	net *fakeNet
	st  *store.Store
}

// newFakeService makes the Service; each edit changes its Config first.
func newFakeService(t *testing.T, edits ...func(*Config)) *fakes {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(own(), filepath.Join(dir, "shard.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f := &fakes{t: t, p: newFakeProvider(), fs: newFakeStorage(), net: newFakeNet(), st: st}
	addr := newFakeAgent(t, proto.Reply{OK: true}).ln.Addr().String()
	cfg := Config{
		DataDir: dir, DefaultProvider: "fake", Providers: []provider.Provider{f.p},
		Images: fakeImages{}, Storage: f.fs, Net: f.net, Store: st,
		Log:         slog.New(slog.DiscardHandler),
		StopTimeout: time.Second, LedgerMinFree: -1, Disk: hostdisk.Roomy(dir),
		AgentAddr: func(*store.Sandbox) string { return addr },
	}
	for _, edit := range edits {
		edit(&cfg)
	}
	svc, err := New(own(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.svc = svc
	return f
}

// create makes a running sandbox.
func (f *fakes) create(name string) *store.Sandbox {
	f.t.Helper()
	sb, err := f.svc.Create(own(), CreateRequest{Name: name, Image: fakeImage})
	if err != nil {
		f.t.Fatalf("Create(%s): %v", name, err)
	}
	return sb
}

// only checks that exactly the sandboxes named are left, everywhere: in
// the store, the runtime, the files, the network and the run directories.
func (f *fakes) only(names ...string) {
	f.t.Helper()
	all, err := f.st.ListSandboxes(own())
	if err != nil {
		f.t.Fatal(err)
	}
	var got, ids []string
	for _, sb := range all {
		got = append(got, sb.Name)
		ids = append(ids, sb.ID)
	}
	slices.Sort(got)
	slices.Sort(names)
	if !slices.Equal(got, names) {
		f.t.Errorf("sandboxes %v, want %v", got, names)
	}
	// Sandboxes made ahead have no record, and no disk.
	withAhead := append(slices.Clone(ids), f.aheadIDs()...)
	slices.Sort(ids)
	slices.Sort(withAhead)
	for what, have := range map[string][]string{
		"runtime containers": f.p.ids(), "network namespaces": f.net.ids(), "run directories": f.runDirs(),
	} {
		if !slices.Equal(have, withAhead) {
			f.t.Errorf("%s %v, want the sandboxes' and those made ahead %v", what, have, withAhead)
		}
	}
	if have := f.fs.ids(); !slices.Equal(have, ids) {
		f.t.Errorf("disks %v, want the sandboxes' %v", have, ids)
	}
}

// aheadIDs are the ids of the sandboxes made ahead and waiting.
func (f *fakes) aheadIDs() []string {
	p := f.svc.ahead
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	for _, sh := range p.shapes {
		for _, ma := range sh.ready {
			ids = append(ids, ma.rec.ID)
		}
	}
	return ids
}

// settleAhead waits until n sandboxes are made ahead and none is being
// made.
func (f *fakes) settleAhead(n int) {
	f.t.Helper()
	p := f.svc.ahead
	for i := 0; ; i++ {
		p.mu.Lock()
		ready, making := 0, 0
		for _, sh := range p.shapes {
			ready += len(sh.ready)
			making += sh.making
		}
		p.mu.Unlock()
		if ready == n && making == 0 {
			return
		}
		if i == 1000 {
			f.t.Fatalf("%d sandboxes made ahead, %d being made; want %d made", ready, making, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sessions checks that exactly the ledger sessions named are there; a
// fork's, fork-SOURCE-ID, is named fork-SOURCE.
func (f *fakes) sessions(names ...string) {
	f.t.Helper()
	all, err := f.st.Sessions(own())
	if err != nil {
		f.t.Fatal(err)
	}
	var got []string
	for _, ss := range all {
		n := ss.Name
		if strings.HasPrefix(n, "fork-") {
			n = n[:strings.LastIndex(n, "-")]
		}
		got = append(got, n)
	}
	slices.Sort(got)
	slices.Sort(names)
	if !slices.Equal(got, names) {
		f.t.Errorf("ledger sessions %v, want %v", got, names)
	}
}

func (f *fakes) runDirs() []string {
	ents, _ := os.ReadDir(filepath.Join(f.svc.cfg.DataDir, "run"))
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out
}

// checkpoints checks what is left of checkpoints: records, memory images
// and saved files.
func (f *fakes) checkpoints(want int) {
	f.t.Helper()
	cks, err := f.st.ListCheckpoints(own(), "")
	if err != nil {
		f.t.Fatal(err)
	}
	images, _ := os.ReadDir(filepath.Join(f.svc.cfg.DataDir, "checkpoints"))
	saved, _ := f.fs.ListSaved()
	if len(cks) != want || len(images) != want || len(saved) != want {
		f.t.Errorf("%d checkpoint records, %d memory images, %d saved files; want %d of each", len(cks), len(images), len(saved), want)
	}
	if n := f.svc.cks.size(); n != 0 {
		f.t.Errorf("%d checkpoints still marked in use", n)
	}
}

func (f *fakes) state(idOrName string) string {
	f.t.Helper()
	sb, err := f.st.GetSandbox(own(), idOrName)
	if err != nil {
		f.t.Fatalf("GetSandbox(%s): %v", idOrName, err)
	}
	return sb.State
}

// fakeProvider is a runtime that checkpoints: it keeps each container's
// status; hooks make its calls fail or wait.
type fakeProvider struct {
	mu sync.Mutex
	c  map[string]provider.Status

	// Hooks, read under mu; nil: succeed.
	checkpointHook func(ctx context.Context, id string) error
	restoreHook    func(id string) error
	aheadHook      func(id string) error // CreateAhead's
	pauses         int
	resumes        int
}

func newFakeProvider() *fakeProvider { return &fakeProvider{c: map[string]provider.Status{}} }

func (p *fakeProvider) Name() string { return "fake" }
func (p *fakeProvider) Probe(context.Context) provider.Capabilities {
	return provider.Capabilities{Name: "fake", Available: true, Fork: true, Snapshot: true, Checkpoint: true}
}

func (p *fakeProvider) set(id string, st provider.Status) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st == provider.StatusAbsent {
		delete(p.c, id)
		return
	}
	p.c[id] = st
}

func (p *fakeProvider) Start(_ context.Context, inst *provider.Instance) error {
	p.set(inst.ID, provider.StatusRunning)
	return nil
}
func (p *fakeProvider) Kill(_ context.Context, id string, _ int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.c[id]; ok {
		p.c[id] = provider.StatusStopped
	}
	return nil
}
func (p *fakeProvider) Delete(_ context.Context, id string) error {
	p.set(id, provider.StatusAbsent)
	return nil
}
func (p *fakeProvider) Status(_ context.Context, id string) (provider.Status, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st, ok := p.c[id]; ok {
		return st, nil
	}
	return provider.StatusAbsent, nil
}
func (p *fakeProvider) List(context.Context) ([]string, error) { return p.ids(), nil }

func (p *fakeProvider) ids() []string { return sortedKeys(&p.mu, p.c) }

func (p *fakeProvider) Pause(_ context.Context, id string) error {
	p.mu.Lock()
	p.pauses++
	p.mu.Unlock()
	p.set(id, provider.StatusPaused)
	return nil
}

// Paused says whether id is paused, as the gVisor provider tracks it.
func (p *fakeProvider) Paused(id string) (paused, sure bool) {
	st, _ := p.Status(own(), id)
	return st == provider.StatusPaused, true
}

func (p *fakeProvider) Resume(_ context.Context, id string) error {
	p.mu.Lock()
	p.resumes++
	p.mu.Unlock()
	p.set(id, provider.StatusRunning)
	return nil
}
func (p *fakeProvider) Checkpoint(ctx context.Context, id, dir string) error {
	p.mu.Lock()
	hook := p.checkpointHook
	p.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, id); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte(id), 0o600)
}
func (p *fakeProvider) Prepare(_ context.Context, inst *provider.Instance, _ string) error {
	p.set(inst.ID, provider.StatusStopped) // created, waiting for a memory image
	return nil
}
func (p *fakeProvider) CreateAhead(_ context.Context, inst *provider.Instance) error {
	p.mu.Lock()
	hook := p.aheadHook
	p.mu.Unlock()
	if hook != nil {
		if err := hook(inst.ID); err != nil {
			return err
		}
	}
	p.set(inst.ID, provider.StatusStopped) // created, its root a placeholder
	return nil
}
func (p *fakeProvider) PrepareAhead(context.Context, *provider.Instance, string) error { return nil }
func (p *fakeProvider) Restore(_ context.Context, inst *provider.Instance, dir string) error {
	p.mu.Lock()
	hook := p.restoreHook
	p.mu.Unlock()
	if hook != nil {
		if err := hook(inst.ID); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.img")); err != nil {
		return err
	}
	p.set(inst.ID, provider.StatusRunning)
	return nil
}

// fakeStorage keeps the sandboxes' disks and the saved copies as names.
type fakeStorage struct {
	backing string // the store's image file, if a test has one
	mu      sync.Mutex
	disks   map[string]bool
	saved   map[string]bool
	// fail, read under mu, makes a call fail: op is "create", "createFrom"
	// or "reserve". nil: succeed.
	fail func(op string) error
	// view, set before use, is View (nil: no views).
	view func(ctx context.Context, id, key, dir string) (func(), error)
}

// failed is what fail says of op.
func (s *fakeStorage) failed(op string) error {
	s.mu.Lock()
	fail := s.fail
	s.mu.Unlock()
	if fail == nil {
		return nil
	}
	return fail(op)
}

func newFakeStorage() *fakeStorage {
	return &fakeStorage{disks: map[string]bool{}, saved: map[string]bool{}}
}

func (s *fakeStorage) put(m map[string]bool, k string, v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v {
		m[k] = true
	} else {
		delete(m, k)
	}
}
func (s *fakeStorage) has(m map[string]bool, k string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return m[k]
}
func (s *fakeStorage) ids() []string { return sortedKeys(&s.mu, s.disks) }

func (s *fakeStorage) Create(_ context.Context, id string, _ int64) error {
	if err := s.failed("create"); err != nil {
		return err
	}
	s.put(s.disks, id, true)
	return nil
}
func (s *fakeStorage) CreateFrom(key, id string) error {
	if err := s.failed("createFrom"); err != nil {
		return err
	}
	if !s.has(s.saved, key) {
		return errors.New("no saved copy " + key)
	}
	s.put(s.disks, id, true)
	return nil
}
func (s *fakeStorage) Save(src, key string) error {
	if !s.has(s.disks, src) {
		return errors.New("no disk " + src)
	}
	s.put(s.saved, key, true)
	return nil
}
func (s *fakeStorage) Mount(_ context.Context, id string, _ []string, target string) error {
	if !s.has(s.disks, id) {
		return errors.New("no disk " + id)
	}
	return os.MkdirAll(target, 0o755)
}
func (s *fakeStorage) Detach(string) error { return nil }
func (s *fakeStorage) Placeholder(target string) error {
	if err := s.failed("placeholder"); err != nil {
		return err
	}
	return os.MkdirAll(target, 0o755)
}
func (s *fakeStorage) Remove(_ context.Context, id string) error {
	s.put(s.disks, id, false)
	return nil
}
func (s *fakeStorage) List() ([]string, error) { return s.ids(), nil }
func (s *fakeStorage) RemoveSaved(key string) error {
	s.put(s.saved, key, false)
	return nil
}
func (s *fakeStorage) ListSaved() ([]string, error) { return sortedKeys(&s.mu, s.saved), nil }
func (s *fakeStorage) SavedPath(key string) string  { return "saved/" + key }
func (s *fakeStorage) Receive(key string, _ int64, _ sparse.Extents, r io.Reader) error {
	io.Copy(io.Discard, r)
	s.put(s.saved, key, true)
	return nil
}
func (s *fakeStorage) ImagePath(id string) string { return "sandboxes/" + id }
func (s *fakeStorage) Bound(string) int64         { return 1 << 30 }
func (s *fakeStorage) View(ctx context.Context, id, key, dir string) (func(), error) {
	if s.view != nil {
		return s.view(ctx, id, key, dir)
	}
	return nil, errors.New("fake storage: no views")
}
func (s *fakeStorage) SavedUsage(string) int64      { return 0 }
func (s *fakeStorage) FileUsage(string) int64       { return 0 }
func (s *fakeStorage) Fits(int64, string) error     { return nil }
func (s *fakeStorage) Space() (rootfs.Space, error) { return rootfs.Space{}, nil }
func (s *fakeStorage) TemplateUsage() (int, int64)  { return 0, 0 }
func (s *fakeStorage) Backing() string              { return s.backing }
func (s *fakeStorage) Size() (int64, int64)         { return 0, 0 }

func (s *fakeStorage) Reserve(map[string]int64, string) (*rootfs.Reservation, error) {
	if err := s.failed("reserve"); err != nil {
		return nil, err
	}
	return &rootfs.Reservation{}, nil
}

// fakeNet keeps the namespaces made.
type fakeNet struct {
	mu sync.Mutex
	ns map[string]bool
}

func newFakeNet() *fakeNet { return &fakeNet{ns: map[string]bool{}} }

func (n *fakeNet) Subnet() netip.Prefix { return netip.MustParsePrefix("10.250.0.0/24") }
func (n *fakeNet) Gateway() netip.Addr  { return netip.MustParseAddr("10.250.0.1") }
func (n *fakeNet) ResolvConf() []byte   { return []byte("nameserver 10.250.0.1\n") }
func (n *fakeNet) Create(_ context.Context, name string, _ netip.Addr) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ns[name] = true
	return "/run/netns/" + name, nil
}
func (n *fakeNet) Delete(name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.ns, name)
	return nil
}
func (n *fakeNet) List() ([]string, error) { return n.ids(), nil }
func (n *fakeNet) ids() []string           { return sortedKeys(&n.mu, n.ns) }

// sortedKeys is m's keys, in order, read under mu.
func sortedKeys[V any](mu *sync.Mutex, m map[string]V) []string {
	mu.Lock()
	defer mu.Unlock()
	return slices.Sorted(maps.Keys(m))
}
func (n *fakeNet) SetPolicy(netip.Addr, *network.Policy) error { return nil }
func (n *fakeNet) CheckPolicy(*network.Policy) error           { return nil }

// fakeImages has one image, of no layers, whatever the name.
type fakeImages struct{}

func (fakeImages) Get(_ context.Context, ref string) (*image.Image, error) {
	return &image.Image{Ref: ref, Name: ref, Digest: fakeImage}, nil
}
func (i fakeImages) Ensure(ctx context.Context, ref string, _ func(image.Progress)) (*image.Image, error) {
	return i.Get(ctx, ref)
}
func (fakeImages) List(context.Context) ([]*image.Image, error) { return nil, nil }
func (fakeImages) Remove(context.Context, string, bool) error   { return nil }
func (fakeImages) Dir() string                                  { return os.TempDir() }
func (fakeImages) Devices(string) []specs.LinuxDevice           { return nil }

// own is the context of a test that calls the service as the server's own
// work does: it sees every project, and makes objects in the default one.
func own() context.Context { return project.Unscoped(context.Background(), "a test") }
