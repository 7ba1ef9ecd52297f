package crossnode

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/revert"
	"github.com/useshards/shard/internal/store"
)

// An environment is built on one node; another node that makes a sandbox
// from it copies its checkpoint on the first use there (EnsureEnvironment
// asks the node that built it, whose SendEnvironment sends it, and Receive
// keeps it as a copy), and keeps the copy while etcd names the same
// checkpoint.

// SendEnvironment sends environment name, built on this node, to node
// node, which keeps it as a copy; it returns the bytes sent.
func (s *Service) SendEnvironment(ctx context.Context, name, node string) (int64, error) {
	e, err := s.Environments.GetEnvironment(ctx, name)
	if err != nil {
		return 0, err
	}
	if e.Origin != "" {
		return 0, errdefs.Conflict(client.CodeEnvironmentCopy, "environment %s here is a copy of node %s's", e.Name, e.Origin)
	}
	to, err := s.Peers.Up(ctx, node)
	if err != nil {
		return 0, err
	}
	doc, err := json.Marshal(e)
	if err != nil {
		return 0, err
	}
	return s.Send(ctx, to, e.Checkpoint, url.Values{"environment": {base64.RawURLEncoding.EncodeToString(doc)}})
}

// EnvironmentOf is the environment a checkpoint sent with ?environment=
// is of (nil for none).
func EnvironmentOf(q url.Values) (*store.Environment, error) {
	v := q.Get("environment")
	if v == "" {
		return nil, nil
	}
	var env *store.Environment
	raw, err := base64.RawURLEncoding.DecodeString(v)
	if err == nil {
		err = json.Unmarshal(raw, &env)
	}
	if err != nil {
		return nil, errdefs.Invalid("environment: %v", err)
	}
	return env, nil
}

// Receive keeps the checkpoint node from sends in r: of env, a copy of
// that environment, when env is not nil; of an import imageRef, which is
// copied here first if this node lacks it, when imageRef is not "". A
// checkpoint of an environment this node has already is kept as it is.
func (s *Service) Receive(ctx context.Context, r io.Reader, env *store.Environment, imageRef, from string) (*store.Checkpoint, error) {
	if imageRef != "" {
		// ImportCheckpoint needs the checkpoint's image.
		if err := s.EnsureImport(ctx, imageRef); err != nil {
			return nil, err
		}
	}
	rv := revert.New()
	defer rv.Fail()
	ck, err := s.Checkpoints.ImportCheckpoint(ctx, r)
	switch {
	case env != nil && errdefs.CodeOf(err) == client.CodeCheckpointExists:
		// A copy made before: kept as it is.
		if err := s.Environments.CacheEnvironment(ctx, env, from); err != nil {
			return nil, err
		}
		return &store.Checkpoint{ID: env.Checkpoint}, nil
	case err != nil:
		return nil, err
	}
	rv.Add(s.undo("checkpoint "+ck.ID, func() error {
		return s.Checkpoints.RemoveCheckpoint(project.Unscoped(context.WithoutCancel(ctx), "a checkpoint received, not kept, is of its sender's project"), ck.ID)
	}))
	if env != nil {
		if err := s.Environments.CacheEnvironment(ctx, env, from); err != nil {
			return nil, err
		}
	}
	rv.Success()
	return ck, nil
}

// EnsureEnvironment makes sure this node holds environment name before a
// create from it: built here, or a copy of the checkpoint etcd names for
// it. A copy is made on the first use here (its origin sends the
// checkpoint) and kept while etcd names the same checkpoint; one whose
// origin rebuilt or removed the environment is dropped. With etcd away a
// copy is used as it is.
func (s *Service) EnsureEnvironment(ctx context.Context, name string) error {
	e, err := s.Environments.GetEnvironment(ctx, name)
	switch {
	case err == nil && e.Origin == "":
		return nil
	case err != nil && !errdefs.Is(err, errdefs.KindNotFound):
		return err
	case err != nil:
		e = nil
	}
	p, perr := s.Records.Environment(ctx, name)
	switch {
	case perr != nil && e != nil && !errdefs.Is(perr, errdefs.KindNotFound):
		return nil // etcd away: the copy is what there is
	case e != nil && perr == nil && p.Checkpoint == e.Checkpoint:
		return nil
	}
	if e != nil { // rebuilt or removed at its origin
		if err := s.Environments.RemoveEnvironment(ctx, name); err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
			return err
		}
	}
	if perr != nil {
		return perr
	}
	origin, err := s.Peers.Up(ctx, p.Node)
	if err != nil {
		return fmt.Errorf("environment %s was built on node %s: %w", name, p.Node, err)
	}
	start := time.Now()
	if err := origin.SendEnvironment(ctx, name, s.Records.Name()); err != nil {
		return fmt.Errorf("environment %s: copy from node %s: %w", name, origin.Name(), err)
	}
	s.Log.Info("environment copied here on first use", "environment", name, "from", origin.Name(), "took", time.Since(start))
	return nil
}
