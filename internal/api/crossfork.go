package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/peer"
	"github.com/useshards/shard/internal/sandbox"
	"github.com/useshards/shard/internal/store"
)

// A fork runs on its source's node. When that node has no room for it
// (the fork's memory, count times, is more than the node's free memory),
// the source is checkpointed here, the checkpoint is sent to the node
// with the most free memory that has the provider, restored there (its
// ledger says from_node), and then removed from both nodes.

// roomHere reports whether this node can take need more bytes of sandboxes.
func (s *Server) roomHere(need int64) bool {
	return s.Cluster == nil || s.Cluster.Free() >= need
}

// forkElsewhere forks src onto another node; count forks are restored
// from the one checkpoint.
func (s *Server) forkElsewhere(r *http.Request, src *store.Sandbox, req sandbox.ForkRequest) (any, int, error) {
	ctx := r.Context()
	need := src.MemoryBytes * int64(req.Count)
	others, err := s.otherUpNodes(ctx)
	if err != nil {
		return nil, 0, err // etcd away: no placement
	}
	target, err := cluster.Choose(others, "", src.Provider, need)
	if err != nil {
		return nil, 0, fmt.Errorf("fork of %s: node %s has no room for it, nor another node: %w", src.Name, s.Cluster.Name(), err)
	}
	if req.Hooks.InSource {
		return nil, 0, errdefs.Unsupported("fork of %s: node %s has no room for it, and hooks_in_source is not available for a fork that moves to another node", src.Name, s.Cluster.Name())
	}
	to, err := s.peerOf(target)
	if err != nil {
		return nil, 0, err
	}
	ctx = asCaller(r)
	hooks := peer.Hooks{FromNode: s.Cluster.Name(), Timeout: req.Hooks.Timeout, Ignore: req.Hooks.Ignore}
	start := time.Now()
	ck, err := s.Sandboxes.Checkpoint(ctx, src.ID, req.Tag)
	if err != nil {
		return nil, 0, err
	}
	bg := context.WithoutCancel(ctx)
	defer s.Sandboxes.RemoveCheckpoint(bg, ck.ID)
	frozen := time.Since(start)
	moved, err := s.sendCheckpoint(ctx, to, ck.ID, nil)
	if err != nil {
		return nil, 0, err
	}
	sent := time.Since(start)
	defer to.RemoveCheckpoint(bg, ck.ID)
	var forks []Sandbox
	for i := range req.Count {
		name := req.Name
		if req.Count > 1 && name != "" {
			name = fmt.Sprintf("%s-%d", req.Name, i+1)
		}
		sb, err := to.Restore(ctx, ck.ID, RestoreRequest{Name: name}, hooks)
		if err != nil {
			for _, f := range forks {
				to.RemoveSandbox(bg, f.ID)
			}
			return nil, 0, fmt.Errorf("fork of %s on node %s: %w", src.Name, target.Name, err)
		}
		forks = append(forks, *sb)
	}
	s.Log.Info("fork moved to another node", "source", src.ID, "node", target.Name, "checkpoint", ck.ID,
		"checkpoint_took", frozen, "sent_bytes", moved, "sent_took", sent-frozen, "total", time.Since(start))
	if req.Count <= 1 {
		return forks[0], http.StatusCreated, nil
	}
	return ForkResponse{Sandboxes: forks}, http.StatusCreated, nil
}

// sendCheckpoint streams checkpoint id to node to (with q for the
// receiver: environment=) and returns the bytes sent. A checkpoint of a
// sandbox made from an imported image names it (image=): the receiver
// copies the import first if it lacks it.
func (s *Server) sendCheckpoint(ctx context.Context, to *peer.Node, id string, q url.Values) (int64, error) {
	if ck, err := s.Sandboxes.GetCheckpoint(ctx, id); err == nil {
		if _, ok := image.ImportName(ck.Image); ok {
			if q == nil {
				q = url.Values{}
			}
			q.Set("image", ck.Image)
		}
	}
	pr, pw := io.Pipe()
	exported := make(chan struct{})
	go func() {
		defer close(exported)
		pw.CloseWithError(s.Sandboxes.ExportCheckpoint(ctx, id, pw))
	}()
	// The exporter reads the checkpoint: it must be done before the caller
	// removes it, whichever way the send ends.
	defer func() {
		pr.CloseWithError(io.ErrClosedPipe)
		<-exported
	}()
	counted := &countingReader{r: pr}
	if err := to.SendCheckpoint(ctx, counted, q); err != nil {
		return 0, fmt.Errorf("send checkpoint %s to node %s: %w", id, to.Name(), err)
	}
	return counted.n, nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n += int64(k)
	return k, err
}

// importCheckpoint is POST /v0/cluster/checkpoints: a checkpoint another
// node sends (only a node may).
func (s *Server) importCheckpoint(w http.ResponseWriter, r *http.Request) {
	if s.Cluster == nil || fromNode(r.Context()) == "" {
		s.writeError(w, r, errdefs.New(errdefs.KindForbidden, client.CodeNodesOnly, "only another node of the cluster may send a checkpoint here"))
		return
	}
	var env *store.Environment
	if v := r.URL.Query().Get("environment"); v != "" {
		raw, err := base64.RawURLEncoding.DecodeString(v)
		if err == nil {
			err = json.Unmarshal(raw, &env)
		}
		if err != nil {
			s.writeError(w, r, errdefs.Invalid("environment: %v", err))
			return
		}
	}
	if ref := r.URL.Query().Get("image"); ref != "" {
		// The checkpoint's image is another node's import: copied here
		// first (ImportCheckpoint needs its image).
		if err := s.ensureImport(r, ref); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	ck, err := s.Sandboxes.ImportCheckpoint(r.Context(), r.Body)
	if env != nil && errdefs.CodeOf(err) == client.CodeCheckpointExists {
		ck, err = &store.Checkpoint{ID: env.Checkpoint}, nil // a copy made before: keep it
	}
	if err == nil && env != nil {
		err = s.Sandboxes.CacheEnvironment(r.Context(), env, fromNode(r.Context()))
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]string{"id": ck.ID})
}

// removeEnvironmentElsewhere removes environment name from every other
// node that is up and reports whether one removed it.
func (s *Server) removeEnvironmentElsewhere(r *http.Request, name string) bool {
	removed := false
	others, _ := s.otherUpPeers(r.Context())
	ctx := asCaller(r)
	for _, n := range others {
		if err := n.RemoveEnvironment(ctx, name); err == nil {
			removed = true
		} else if !errdefs.Is(err, errdefs.KindNotFound) {
			s.cfgLog().Warn("cluster: a node did not remove an environment", "node", n.Name(), "environment", name, "err", err)
		}
	}
	return removed
}

// ensureEnvironment makes sure this node holds environment name before a
// create from it: built here, or a copy of the checkpoint etcd names for
// it. A copy is made on the first use here (its origin sends the
// checkpoint) and kept while etcd names the same checkpoint; one whose
// origin rebuilt or removed the environment is dropped. With etcd away a
// copy is used as it is.
func (s *Server) ensureEnvironment(r *http.Request, name string) error {
	ctx := asCaller(r)
	e, err := s.Sandboxes.GetEnvironment(ctx, name)
	switch {
	case err == nil && e.Origin == "":
		return nil
	case err != nil && !errdefs.Is(err, errdefs.KindNotFound):
		return err
	}
	p, perr := s.Cluster.Environment(ctx, name)
	switch {
	case perr != nil && e != nil && !errdefs.Is(perr, errdefs.KindNotFound):
		return nil // etcd away: the copy is what there is
	case e != nil && perr == nil && p.Checkpoint == e.Checkpoint:
		return nil
	}
	if e != nil { // rebuilt or removed at its origin
		if err := s.Sandboxes.RemoveEnvironment(ctx, name); err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
			return err
		}
	}
	if perr != nil {
		return perr
	}
	origin, err := s.upPeer(ctx, p.Node)
	if err != nil {
		return fmt.Errorf("environment %s was built on node %s: %w", name, p.Node, err)
	}
	start := time.Now()
	if err := origin.SendEnvironment(ctx, name, s.Cluster.Name()); err != nil {
		return fmt.Errorf("environment %s: copy from node %s: %w", name, origin.Name(), err)
	}
	s.Log.Info("environment copied here on first use", "environment", name, "from", origin.Name(), "took", time.Since(start))
	return nil
}

// sendEnvironment is POST /v0/cluster/environments/{name}/send?to=NODE
// (nodes only): this node, which built the environment, sends its
// checkpoint to NODE, which keeps it as a copy.
func (s *Server) sendEnvironment(r *http.Request) (any, int, error) {
	ctx := asCaller(r)
	e, err := s.Sandboxes.GetEnvironment(ctx, r.PathValue("name"))
	if err != nil {
		return nil, 0, err
	}
	if e.Origin != "" {
		return nil, 0, errdefs.Conflict(client.CodeEnvironmentCopy, "environment %s here is a copy of node %s's", e.Name, e.Origin)
	}
	to, err := s.upPeer(ctx, r.URL.Query().Get("to"))
	if err != nil {
		return nil, 0, err
	}
	doc, _ := json.Marshal(e)
	q := url.Values{"environment": {base64.RawURLEncoding.EncodeToString(doc)}}
	n, err := s.sendCheckpoint(ctx, to, e.Checkpoint, q)
	if err != nil {
		return nil, 0, err
	}
	return map[string]any{"sent_bytes": n}, 200, nil
}

// nodesOnly answers a route only another node of the cluster may call.
func (s *Server) nodesOnly(fn func(*http.Request) (any, int, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.Cluster == nil || fromNode(r.Context()) == "" {
			s.writeError(w, r, errdefs.New(errdefs.KindForbidden, client.CodeNodesOnly, "only another node of the cluster may call %s", r.URL.Path))
			return
		}
		v, code, err := fn(r)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		writeJSON(w, code, v)
	}
}
