package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/errdefs"
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
	nodes, err := s.Cluster.Nodes(ctx)
	if err != nil {
		return nil, 0, err
	}
	others := nodes[:0:0]
	for _, n := range nodes {
		if n.Name != s.Cluster.Name() {
			others = append(others, n)
		}
	}
	target, err := cluster.Choose(others, "", src.Provider, need)
	if err != nil {
		return nil, 0, fmt.Errorf("fork of %s: node %s has no room for it, nor another node: %w", src.Name, s.Cluster.Name(), err)
	}
	start := time.Now()
	ck, err := s.Sandboxes.Checkpoint(ctx, src.ID, req.Tag)
	if err != nil {
		return nil, 0, err
	}
	bg := context.WithoutCancel(ctx)
	defer s.Sandboxes.RemoveCheckpoint(bg, ck.ID)
	frozen := time.Since(start)
	moved, err := s.sendCheckpoint(ctx, r, target, ck.ID)
	if err != nil {
		return nil, 0, err
	}
	sent := time.Since(start)
	defer s.call(bg, r, target, http.MethodDelete, "/v0/checkpoints/"+ck.ID, nil, nil)
	var forks []Sandbox
	for i := range req.Count {
		name := req.Name
		if req.Count > 1 && name != "" {
			name = fmt.Sprintf("%s-%d", req.Name, i+1)
		}
		body, _ := json.Marshal(RestoreRequest{Name: name})
		var sb Sandbox
		if _, err := s.call(ctx, r, target, http.MethodPost, "/v0/checkpoints/"+ck.ID+"/restore?from_node="+url.QueryEscape(s.Cluster.Name()), body, &sb); err != nil {
			for _, f := range forks {
				s.call(bg, r, target, http.MethodDelete, "/v0/sandboxes/"+f.ID+"?force=true", nil, nil)
			}
			return nil, 0, fmt.Errorf("fork of %s on node %s: %w", src.Name, target.Name, err)
		}
		forks = append(forks, sb)
	}
	s.Log.Info("fork moved to another node", "source", src.ID, "node", target.Name, "checkpoint", ck.ID,
		"checkpoint_took", frozen, "sent_bytes", moved, "sent_took", sent-frozen, "total", time.Since(start))
	if req.Count <= 1 {
		return forks[0], http.StatusCreated, nil
	}
	return ForkResponse{Sandboxes: forks}, http.StatusCreated, nil
}

// sendCheckpoint streams checkpoint id to node and returns the bytes sent.
func (s *Server) sendCheckpoint(ctx context.Context, in *http.Request, node cluster.Node, id string) (int64, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(s.Sandboxes.ExportCheckpoint(ctx, id, pw)) }()
	counted := &countingReader{r: pr}
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, node.Address+"/v0/cluster/checkpoints", counted)
	if err != nil {
		return 0, err
	}
	out.Header.Set("Content-Type", "application/zstd")
	s.vouch(out, in)
	resp, err := s.transport().RoundTrip(out)
	pr.CloseWithError(io.ErrClosedPipe) // the exporter stops if the send failed early
	if err != nil {
		return 0, errdefs.New(errdefs.KindUnreachable, "node_unreachable", "node %s (%s) does not answer: %v", node.Name, node.Address, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		var e Error
		json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&e)
		return 0, errdefs.New(kindOfStatus(resp.StatusCode), e.Code, "node %s refused the checkpoint: %s", node.Name, e.Message)
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
		s.writeError(w, r, errdefs.New(errdefs.KindForbidden, "nodes_only", "only another node of the cluster may send a checkpoint here"))
		return
	}
	ck, err := s.Sandboxes.ImportCheckpoint(r.Context(), r.Body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]string{"id": ck.ID})
}
