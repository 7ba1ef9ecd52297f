package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/crossnode"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/sandbox"
	"github.com/useshards/shard/internal/store"
)

// What spans two nodes (a fork moved to another node, a checkpoint sent,
// an environment's or an import's copy) is the cross-node service's
// (internal/crossnode): the handlers here choose the nodes and answer.

// crossNode is the cross-node service, made on first use.
func (s *Server) crossNode() *crossnode.Service {
	s.crossOnce.Do(func() {
		saved := s.Sandboxes.Saved()
		s.cross = &crossnode.Service{Checkpoints: saved, Environments: saved, Images: s.Images, Sandboxes: s.Sandboxes,
			Records: s.Cluster, Peers: upPeers{s}, Log: s.cfgLog()}
	})
	return s.cross
}

// upPeers finds the clients of the other nodes for crossNode.
type upPeers struct{ s *Server }

func (u upPeers) Up(ctx context.Context, node string) (crossnode.Peer, error) {
	n, err := u.s.upPeer(ctx, node)
	if err != nil {
		return nil, err
	}
	return n, nil
}

// roomHere reports whether this node can take need more bytes of sandboxes.
func (s *Server) roomHere(need int64) bool {
	return s.Cluster == nil || s.Cluster.Free() >= need
}

// forkElsewhere forks src onto the node with the most free memory that
// has its provider, as this node has no room for it: count forks are
// restored there from one checkpoint (crossnode.Service.Fork).
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
	to, err := s.peerOf(target)
	if err != nil {
		return nil, 0, err
	}
	forks, err := s.crossNode().Fork(asCaller(r), src, req, to)
	if err != nil {
		return nil, 0, err
	}
	if req.Count <= 1 {
		return forks[0], http.StatusCreated, nil
	}
	return ForkResponse{Sandboxes: forks}, http.StatusCreated, nil
}

// importCheckpoint is POST /v0/cluster/checkpoints: a checkpoint another
// node sends (only a node may), with ?environment= (a copy of that
// environment) and ?image= (of that import, copied here first).
func (s *Server) importCheckpoint(w http.ResponseWriter, r *http.Request) {
	if s.Cluster == nil || fromNode(r.Context()) == "" {
		s.writeError(w, r, errdefs.New(errdefs.KindForbidden, client.CodeNodesOnly, "only another node of the cluster may send a checkpoint here"))
		return
	}
	env, err := crossnode.EnvironmentOf(r.URL.Query())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ck, err := s.crossNode().Receive(asCaller(r), r.Body, env, r.URL.Query().Get("image"), fromNode(r.Context()))
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

// sendEnvironment is POST /v0/cluster/environments/{name}/send?to=NODE
// (nodes only): this node, which built the environment, sends its
// checkpoint to NODE, which keeps it as a copy.
func (s *Server) sendEnvironment(r *http.Request) (any, int, error) {
	n, err := s.crossNode().SendEnvironment(asCaller(r), r.PathValue("name"), r.URL.Query().Get("to"))
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
