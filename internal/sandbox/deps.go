package sandbox

import (
	"context"
	"io"
	"net/netip"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/network"
	"github.com/useshards/shard/internal/rootfs"
	"github.com/useshards/shard/internal/sparse"
)

// What the service uses of its neighbours, each as small as the service's
// use of it, so that a unit test can build a Service over fakes (see
// fake_test.go) and drive its failure paths without root or a runtime. The
// runtimes are provider.Provider already; the metadata store stays the real
// one (pure Go SQLite, opened in a temporary directory by a test).

// Images is the image cache (image.Store).
type Images interface {
	Get(ctx context.Context, ref string) (*image.Image, error)
	Ensure(ctx context.Context, ref string, progress func(image.Progress)) (*image.Image, error)
	List(ctx context.Context) ([]*image.Image, error)
	Remove(ctx context.Context, ref string, force bool) error
	Dir() string
	Devices(ref string) []specs.LinuxDevice
}

// Storage is the sandboxes' files: each sandbox's disk, and the copies
// kept by checkpoints and snapshots (rootfs.Storage).
type Storage interface {
	Create(ctx context.Context, id string, limit int64) error
	CreateFrom(key, id string) error
	Save(src, key string) error
	Mount(ctx context.Context, id string, lowers []string, target string) error
	// Placeholder makes target the empty root of a sandbox made ahead,
	// which a later Mount at target mounts over (ahead.go).
	Placeholder(target string) error
	Detach(id string) error
	Remove(ctx context.Context, id string) error
	List() ([]string, error)
	RemoveSaved(key string) error
	ListSaved() ([]string, error)
	SavedPath(key string) string
	Receive(key string, size int64, ext sparse.Extents, r io.Reader) error // files another node sent
	ImagePath(id string) string
	Bound(id string) int64
	SavedUsage(key string) int64
	FileUsage(id string) int64
	Reserve(need map[string]int64, what string) (*rootfs.Reservation, error)
	Fits(need int64, what string) error
	Space() (rootfs.Space, error)
	Size() (size, most int64) // the store image's size, and the most it may grow to now
	TemplateUsage() (n int, bytes int64)
	Backing() string
	View(ctx context.Context, id, key, dir string) (release func(), err error)
}

// Network is the sandboxes' network namespaces on the bridge and their
// egress policies (network.Manager).
type Network interface {
	Subnet() netip.Prefix
	Gateway() netip.Addr
	ResolvConf() []byte
	Create(ctx context.Context, name string, ip netip.Addr) (nsPath string, err error)
	Delete(name string) error
	List() ([]string, error)
	SetPolicy(ip netip.Addr, p *network.Policy) error
	// CheckPolicy refuses a policy that allows what the server's egress
	// boundary never lets a sandbox reach.
	CheckPolicy(p *network.Policy) error
}

var (
	_ Images  = (*image.Store)(nil)
	_ Storage = (*rootfs.Storage)(nil)
	_ Network = (*network.Manager)(nil)
)
