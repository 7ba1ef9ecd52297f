// Package crossnode runs what spans two nodes of a cluster: a fork moved
// to another node when its source's has no room, a checkpoint sent and
// received, and an environment's or an imported image's copy made on its
// first use on a node. Each step that leaves something behind is paired
// with its undo (internal/revert), so a failure half-way leaves nothing on
// either node. The service holds small interfaces of this node's services
// and of the other node (a *peer.Node), which its tests fake.
package crossnode

import (
	"context"
	"io"
	"log/slog"
	"net/url"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/kmutex"
	"github.com/useshards/shard/internal/peer"
	"github.com/useshards/shard/internal/store"
)

// Checkpoints is what the service uses of this node's checkpoints
// (sandbox.Saved).
type Checkpoints interface {
	Checkpoint(ctx context.Context, idOrName, tag string) (*store.Checkpoint, error)
	GetCheckpoint(ctx context.Context, id string) (*store.Checkpoint, error)
	RemoveCheckpoint(ctx context.Context, id string) error
	ExportCheckpoint(ctx context.Context, id string, w io.Writer) error
	ImportCheckpoint(ctx context.Context, r io.Reader) (*store.Checkpoint, error)
}

// Environments is what the service uses of this node's environments
// (sandbox.Saved).
type Environments interface {
	GetEnvironment(ctx context.Context, name string) (*store.Environment, error)
	CacheEnvironment(ctx context.Context, e *store.Environment, origin string) error
	RemoveEnvironment(ctx context.Context, name string) error
}

// Images is what the service uses of this node's images (image.Store).
type Images interface {
	Get(ctx context.Context, ref string) (*image.Image, error)
	Remove(ctx context.Context, ref string, shared bool) error
	ImportCopy(ctx context.Context, r io.Reader, ref, digest, origin string) (*image.Image, error)
}

// Sandboxes lists this node's sandboxes (sandbox.Service): an image copy
// a sandbox uses stays.
type Sandboxes interface {
	List(ctx context.Context) ([]*store.Sandbox, error)
}

// Records is what the service reads of the cluster's records in etcd
// (cluster.Cluster).
type Records interface {
	Name() string // this node's
	Environment(ctx context.Context, name string) (*cluster.EnvPlacement, error)
	Image(ctx context.Context, ref string) (*cluster.ImagePlacement, error)
}

// Receiver is a node a checkpoint is sent to.
type Receiver interface {
	Name() string
	SendCheckpoint(ctx context.Context, r io.Reader, q url.Values) error
}

// Restorer is the node a fork moves to: it takes the source's checkpoint
// and restores the forks from it.
type Restorer interface {
	Receiver
	Restore(ctx context.Context, checkpointID string, req client.RestoreRequest, hooks peer.Hooks) (*client.Sandbox, error)
	RemoveCheckpoint(ctx context.Context, id string) error
	RemoveSandbox(ctx context.Context, id string) error
}

// Origin is the node that built an environment or imported an image,
// which sends a copy of it.
type Origin interface {
	Name() string
	SendEnvironment(ctx context.Context, name, to string) error
	FetchImport(ctx context.Context, ref string, into func(io.Reader) error) error
}

// Peer is another node, as the service finds it by name.
type Peer interface {
	Receiver
	Origin
}

// Peers finds the client of another node that is up (an error, such as
// 503 node_unreachable, when it is not).
type Peers interface {
	Up(ctx context.Context, node string) (Peer, error)
}

// Service runs the operations across nodes. Contexts carry the project
// they act in and the caller the other node's calls are made for
// (peer.WithCaller).
type Service struct {
	Checkpoints  Checkpoints
	Environments Environments
	Images       Images
	Sandboxes    Sandboxes
	Records      Records
	Peers        Peers
	Log          *slog.Logger

	importLocks kmutex.Keyed // one copy of an import at a time, by project and name
}

// undo returns fn as an undo step (revert's, or a deferred cleanup): its
// error is logged, as nobody else sees it.
func (s *Service) undo(what string, fn func() error) func() {
	return func() {
		if err := fn(); err != nil {
			s.Log.Warn("cluster: an undo failed, and what it undoes is left behind", "left", what, "err", err)
		}
	}
}

// countingReader counts what is read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n += int64(k)
	return k, err
}
